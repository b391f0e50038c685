/* Lets atheris count Python coverage in a process where the ASan runtime is preloaded.
 *
 * atheris's copy of libFuzzer registers the counters of instrumented Python code with
 * __sanitizer_cov_8bit_counters_init and __sanitizer_cov_pcs_init, and reports Python
 * comparisons with __sanitizer_cov_trace_cmp8 and __sanitizer_cov_trace_const_cmp8,
 * calling its own definitions through the dynamic linker. The linker takes the first
 * definition in the process's global scope, and with LD_PRELOAD=libasan.so that is the
 * ASan runtime's do-nothing weak default: Python coverage then silently stays at zero
 * (atheris warns that "coverage symbols are being provided by a library other than
 * libFuzzer"). Preloaded ahead of the ASan runtime (run.sh), this library defines the
 * four first and forwards each call to the libFuzzer that atheris loaded (comparisons by
 * tail call, so libFuzzer still sees the caller's address). atheris still prints its
 * warning, naming this library.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void* libfuzzer;

static int find_libfuzzer(struct dl_phdr_info* info, size_t size, void* data)
{
    void* handle;
    Dl_info where;
    (void)size;
    (void)data;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
        return 0;
    handle = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return 0;
    void* driver = dlsym(handle, "LLVMFuzzerRunDriver");
    if (driver && dladdr(driver, &where) && (uintptr_t)where.dli_fbase == info->dlpi_addr) {
        libfuzzer = handle;
        return 1;
    }
    dlclose(handle);
    return 0;
}

/* libFuzzer's definition of name; exits when there is none (nothing could be counted). */
static void* real(const char* name)
{
    void* fn;
    if (libfuzzer == NULL && !dl_iterate_phdr(find_libfuzzer, NULL)) {
        fprintf(stderr, "forward.c: %s called, but no libFuzzer is loaded\n", name);
        abort();
    }
    fn = dlsym(libfuzzer, name);
    if (fn == NULL) {
        fprintf(stderr, "forward.c: libFuzzer has no %s\n", name);
        abort();
    }
    return fn;
}

typedef void (*counters_fn)(uint8_t*, uint8_t*);
typedef void (*pcs_fn)(const uintptr_t*, const uintptr_t*);
typedef void (*cmp8_fn)(uint64_t, uint64_t);

static counters_fn real_counters_init;
static pcs_fn real_pcs_init;
static cmp8_fn real_cmp8, real_const_cmp8;

void __sanitizer_cov_8bit_counters_init(uint8_t* start, uint8_t* stop)
{
    if (real_counters_init == NULL)
        real_counters_init = (counters_fn)real("__sanitizer_cov_8bit_counters_init");
    real_counters_init(start, stop);
}

void __sanitizer_cov_pcs_init(const uintptr_t* start, const uintptr_t* stop)
{
    if (real_pcs_init == NULL)
        real_pcs_init = (pcs_fn)real("__sanitizer_cov_pcs_init");
    real_pcs_init(start, stop);
}

void __sanitizer_cov_trace_cmp8(uint64_t a, uint64_t b)
{
    if (real_cmp8 == NULL)
        real_cmp8 = (cmp8_fn)real("__sanitizer_cov_trace_cmp8");
    real_cmp8(a, b);
}

void __sanitizer_cov_trace_const_cmp8(uint64_t a, uint64_t b)
{
    if (real_const_cmp8 == NULL)
        real_const_cmp8 = (cmp8_fn)real("__sanitizer_cov_trace_const_cmp8");
    real_const_cmp8(a, b);
}
