/* Native coverage for libFuzzer from gcc-instrumented code: wdsmp's fuzz targets.
 *
 * gcc's -fsanitize-coverage=trace-pc calls __sanitizer_cov_trace_pc() at the start of
 * every basic block, and trace-cmp calls __sanitizer_cov_trace_cmp*() at every integer
 * comparison. The libFuzzer inside atheris does not count trace-pc calls (its hook only
 * warns that the interface is deprecated): it reads clang's inline 8-bit counters,
 * registered with __sanitizer_cov_8bit_counters_init and __sanitizer_cov_pcs_init. This
 * file bridges the two. build.sh compiles it once and links it into each instrumented
 * extension, its hooks hidden so that the extension's calls bind to them at link time
 * (the preloaded ASan runtime exports do-nothing versions of the comparison hooks, which
 * would otherwise win at load time). Each extension thus gets its own copy, which gives
 * the extension's executable segment a counter array, one byte per 4 bytes of code,
 * and counts each basic block at (return address - segment start) / 4: call sites are
 * at least 5 bytes apart, so no two blocks share a counter. Comparisons are forwarded to
 * libFuzzer's own hooks by tail calls, so libFuzzer still sees the caller's address.
 *
 * Nothing is counted until the fuzz script calls wdsmp_cov_register() (through ctypes,
 * once libFuzzer is loaded: atheris loads it when fuzzing starts). The summary at exit
 * says how many of the extension's instrumented blocks any input reached; with
 * WDSMP_SANCOV_DUMP=FILE in the environment it also appends their addresses there
 * ("extension offset" lines, offsets from the module's load address), which
 * native_coverage.py breaks down by function.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOOK __attribute__((visibility("hidden")))

static uintptr_t base;                 /* the extension's load address */
static uintptr_t seg_start, seg_size;  /* its executable segment; 0 until registered */
static uint8_t* counters;             /* one per 4 bytes of code; libFuzzer clears them per input */
static uintptr_t* pcs;                /* libFuzzer's PC table: (pc, flags) per counter */
static uint8_t* seen;                 /* counters ever hit, for the summary */
static long reached, sites;
static char name[256];

HOOK void __sanitizer_cov_trace_pc(void)
{
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    if (pc - seg_start < seg_size) {
        size_t k = (pc - seg_start) >> 2;
        if (counters[k] != 255)  /* saturate: a wrapped counter would read as "not hit" */
            counters[k]++;
        if (!seen[k]) {
            seen[k] = 1;
            pcs[2 * k] = pc;
            reached++;
        }
    }
}

/* Comparisons: forwarded to libFuzzer (its table of recent compares feeds mutations). */
typedef void (*cmp1_fn)(uint8_t, uint8_t);
typedef void (*cmp2_fn)(uint16_t, uint16_t);
typedef void (*cmp4_fn)(uint32_t, uint32_t);
typedef void (*cmp8_fn)(uint64_t, uint64_t);
typedef void (*switch_fn)(uint64_t, uint64_t*);

static cmp1_fn fn_cmp1, fn_const_cmp1;
static cmp2_fn fn_cmp2, fn_const_cmp2;
static cmp4_fn fn_cmp4, fn_const_cmp4;
static cmp8_fn fn_cmp8, fn_const_cmp8;
static switch_fn fn_switch;

#define FORWARD(hook, fn, type)   \
    HOOK void hook(type a, type b) \
    {                              \
        if (fn)                    \
            fn(a, b);              \
    }

FORWARD(__sanitizer_cov_trace_cmp1, fn_cmp1, uint8_t)
FORWARD(__sanitizer_cov_trace_cmp2, fn_cmp2, uint16_t)
FORWARD(__sanitizer_cov_trace_cmp4, fn_cmp4, uint32_t)
FORWARD(__sanitizer_cov_trace_cmp8, fn_cmp8, uint64_t)
FORWARD(__sanitizer_cov_trace_const_cmp1, fn_const_cmp1, uint8_t)
FORWARD(__sanitizer_cov_trace_const_cmp2, fn_const_cmp2, uint16_t)
FORWARD(__sanitizer_cov_trace_const_cmp4, fn_const_cmp4, uint32_t)
FORWARD(__sanitizer_cov_trace_const_cmp8, fn_const_cmp8, uint64_t)

HOOK void __sanitizer_cov_trace_switch(uint64_t value, uint64_t* cases)
{
    if (fn_switch)
        fn_switch(value, cases);
}

/* gcc also traces floating-point comparisons; libFuzzer has no hook for them. */
HOOK void __sanitizer_cov_trace_cmpf(float a, float b) { (void)a; (void)b; }
HOOK void __sanitizer_cov_trace_cmpd(double a, double b) { (void)a; (void)b; }

typedef struct {
    const char* path;
    uintptr_t base, start, end;
} segment_t;

static int find_segment(struct dl_phdr_info* info, size_t size, void* data)
{
    segment_t* s = data;
    (void)size;
    if (info->dlpi_name == NULL || strcmp(info->dlpi_name, s->path) != 0)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            s->base = info->dlpi_addr;
            s->start = info->dlpi_addr + ph->p_vaddr;
            s->end = s->start + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

static void* zeros(size_t size)
{
    void* p = NULL;
    if (posix_memalign(&p, 4096, size) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

/* Registers this extension's code with the libFuzzer loaded from libfuzzer_path;
   block_sites is its number of instrumented basic blocks (for the summary). Returns 0,
   or -1 with a message on stderr. */
int wdsmp_cov_register(const char* libfuzzer_path, long block_sites)
{
    Dl_info self;
    segment_t s = {NULL, 0, 0, 0};
    void* lib;
    void (*counters_init)(uint8_t*, uint8_t*);
    void (*pcs_init)(const uintptr_t*, const uintptr_t*);
    size_t n;
    if (seg_size) {
        fprintf(stderr, "sancov: already registered\n");
        return -1;
    }
    if (!dladdr((void*)wdsmp_cov_register, &self) || self.dli_fname == NULL) {
        fprintf(stderr, "sancov: cannot tell which module this is\n");
        return -1;
    }
    s.path = self.dli_fname;
    if (!dl_iterate_phdr(find_segment, &s)) {
        fprintf(stderr, "sancov: no executable segment found for %s\n", s.path);
        return -1;
    }
    lib = dlopen(libfuzzer_path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        fprintf(stderr, "sancov: libFuzzer (%s) is not loaded: %s\n", libfuzzer_path, dlerror());
        return -1;
    }
    counters_init = (void (*)(uint8_t*, uint8_t*))dlsym(lib, "__sanitizer_cov_8bit_counters_init");
    pcs_init = (void (*)(const uintptr_t*, const uintptr_t*))dlsym(lib, "__sanitizer_cov_pcs_init");
    fn_cmp1 = (cmp1_fn)dlsym(lib, "__sanitizer_cov_trace_cmp1");
    fn_cmp2 = (cmp2_fn)dlsym(lib, "__sanitizer_cov_trace_cmp2");
    fn_cmp4 = (cmp4_fn)dlsym(lib, "__sanitizer_cov_trace_cmp4");
    fn_cmp8 = (cmp8_fn)dlsym(lib, "__sanitizer_cov_trace_cmp8");
    fn_const_cmp1 = (cmp1_fn)dlsym(lib, "__sanitizer_cov_trace_const_cmp1");
    fn_const_cmp2 = (cmp2_fn)dlsym(lib, "__sanitizer_cov_trace_const_cmp2");
    fn_const_cmp4 = (cmp4_fn)dlsym(lib, "__sanitizer_cov_trace_const_cmp4");
    fn_const_cmp8 = (cmp8_fn)dlsym(lib, "__sanitizer_cov_trace_const_cmp8");
    fn_switch = (switch_fn)dlsym(lib, "__sanitizer_cov_trace_switch");
    if (counters_init == NULL || pcs_init == NULL) {
        fprintf(stderr, "sancov: %s has no inline 8-bit counter interface\n", libfuzzer_path);
        return -1;
    }
    n = ((s.end - s.start) >> 2) + 1;
    counters = zeros(n);
    seen = zeros(n);
    pcs = zeros(2 * n * sizeof(uintptr_t));
    if (counters == NULL || seen == NULL || pcs == NULL) {
        fprintf(stderr, "sancov: out of memory\n");
        return -1;
    }
    for (size_t k = 0; k < n; k++)
        pcs[2 * k] = s.start + 4 * k;  /* until the block is reached and its address known */
    sites = block_sites;
    snprintf(name, sizeof name, "%s", strrchr(s.path, '/') ? strrchr(s.path, '/') + 1 : s.path);
    counters_init(counters, counters + n);
    pcs_init(pcs, pcs + 2 * n);
    base = s.base;
    seg_start = s.start;
    seg_size = s.end - s.start;  /* last: from here on the hook counts */
    return 0;
}

/* Blocks of this extension reached so far by any input; -1 before registering. */
long wdsmp_cov_reached(void)
{
    return seg_size ? reached : -1;
}

/* libFuzzer ends with exit(): say what the native code reached. */
__attribute__((destructor)) static void report(void)
{
    const char* dump = getenv("WDSMP_SANCOV_DUMP");
    FILE* out;
    if (!seg_size)
        return;
    fprintf(stderr, "native coverage: %s: %ld of %ld instrumented basic blocks reached\n",
            name, reached, sites);
    if (dump == NULL || *dump == '\0')
        return;
    out = fopen(dump, "a");
    if (out == NULL) {
        perror(dump);
        return;
    }
    for (uintptr_t k = 0; k <= seg_size >> 2; k++)
        if (seen[k])
            fprintf(out, "%s %lx\n", name, (unsigned long)(pcs[2 * k] - base));
    fclose(out);
}
