"""``install_as_webdataset()``: libraries that import ``webdataset`` themselves (timm,
open_clip, NeMo, SpeechBrain, lhotse) run on wdsmp without an edit, as
``pymysql.install_as_MySQLdb()`` does for MySQLdb.

NOTE [webdataset alias]
    * ``sys.modules["webdataset"]`` becomes the wdsmp package, and
      ``sys.modules["webdataset.<name>"]`` wdsmp's module of that name for each
      submodule of webdataset 1.0.2 that wdsmp has (all but ``multi`` and
      ``typecheck``): ``import webdataset``, ``from webdataset import ...``,
      ``import webdataset.shardlists`` and ``webdataset.autodecode.X`` all
      reach wdsmp's objects, so a monkey-patch through either name is seen by
      both. The submodules are imported at once (torch with them): a lazy
      alias would need the import system to load one module under two names.
    * It acts in the calling process. DataLoader workers made by ``fork``
      inherit it. ``spawn`` and ``forkserver`` workers are fresh interpreters
      that import the main script (as ``__mp_main__``) before they unpickle
      the dataset, and unpickling imports the library's modules: call it at
      the top level of the script, not under ``if __name__ ==
      "__main__":``, and the workers install it before the library asks for
      webdataset. FastLoader's workers run no webdataset code.
    * Modules that imported the real webdataset before the call keep it: it
      warns.
"""

import importlib
import sys
import warnings

__all__ = ["install_as_webdataset"]

# webdataset 1.0.2's submodules that wdsmp has, under the same names.
WEBDATASET_MODULES = ("autodecode", "cache", "compat", "extradatasets", "filters", "gopen", "handlers", "mix",
                      "pipeline", "pytorch", "shardlists", "tariterators", "tenbin", "utils", "writer")


def install_as_webdataset() -> None:
    """Make ``import webdataset`` (and its submodules) give wdsmp in this process from now on
    (NOTE [webdataset alias]). Idempotent. Call it at the top level of the training script,
    before the libraries that use webdataset are imported::

        import wdsmp
        wdsmp.install_as_webdataset()
        import webdataset           # wdsmp, for every library imported from here on too
        assert webdataset is wdsmp
    """
    package = importlib.import_module("wdsmp")
    before = sys.modules.get("webdataset")
    if before is not None and before is not package:
        warnings.warn(f"install_as_webdataset(): webdataset was imported before it ({before.__file__}): modules "
                      f"that imported it keep it. Call it first, at the top of the script", RuntimeWarning,
                      stacklevel=2)
    for name in list(sys.modules):
        if name.startswith("webdataset."):
            del sys.modules[name]
    sys.modules["webdataset"] = package
    for name in WEBDATASET_MODULES:
        sys.modules[f"webdataset.{name}"] = importlib.import_module(f"wdsmp.{name}")
