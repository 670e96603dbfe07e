"""stubload.py — import a few real modules from the peers' wheels without their
packages' heavy import chains.

Owns: the import hook that (1) turns every package on the way to a real module
into an empty shell (its __init__.py is not run: vllm's and sglang's pull in
torch, CUDA probes, servers), (2) loads the listed real modules from the wheel's
own files, unchanged, and (3) replaces every other module they import with a
stub that records its name. Stubs are armed after the import: any use of a stub
while the replay runs raises, so a replay that finishes proves it never reached
stubbed code. The list of stubs a run needed is printed (`--list-stubs`) and
kept in README.md.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

STUBBED = []          # module names replaced by stubs, in import order
_armed = [False]


class StubUsed(RuntimeError):
    pass


class _StubMeta(type):
    """A stub class: subclassable and annotatable at import time, dead after."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if _armed[0]:
            raise StubUsed(f"stub {cls.__qualname__}.{name} used")
        return _stub_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *a, **k):
        if _armed[0]:
            raise StubUsed(f"stub {cls.__qualname__} called")
        # decorators and factories used at import time: pass a function through
        if len(a) == 1 and not k and callable(a[0]):
            return a[0]
        return _stub_class(f"{cls.__qualname__}()")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


def _stub_class(qualname):
    c = _StubMeta(qualname.rsplit(".", 1)[-1], (), {})
    c.__qualname__ = qualname
    return c


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if _armed[0]:
            raise StubUsed(f"stub module {self.__name__}.{name} used")
        v = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, v)
        return v


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, site, real, shells, overrides, extra_stubs):
        self.site, self.real, self.shells, self.overrides = site, set(real), set(shells), overrides
        self.tops = {s.split(".")[0] for s in shells}
        self.extra_stubs = set(extra_stubs)

    def find_spec(self, name, path=None, target=None):
        if name in self.overrides or name in self.shells:
            return importlib.machinery.ModuleSpec(name, self, is_package=name in self.shells)
        if name in self.real:
            rel = name.replace(".", "/")
            f = os.path.join(self.site, rel + ".py")
            return importlib.util.spec_from_file_location(name, f)
        top = name.split(".")[0]
        if top in self.tops or name in self.extra_stubs:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None  # anything else imports as usual (or fails as usual)

    def create_module(self, spec):
        name = spec.name
        if name in self.overrides:
            return self.overrides[name]
        if name in self.shells:
            m = types.ModuleType(name)
            m.__path__ = [os.path.join(self.site, name.replace(".", "/"))]
            return m
        STUBBED.append(name)
        m = _StubModule(name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install(site, real, overrides=None, extra_stubs=()):
    """Load `real` (dotted module names) from `site`; shell their parent packages;
    stub whatever else of the same top-level packages they import, and the
    third-party modules named in `extra_stubs`. `overrides` maps names to ready
    modules."""
    shells = set()
    for r in real:
        parts = r.split(".")
        for i in range(1, len(parts)):
            shells.add(".".join(parts[:i]))
    sys.meta_path.insert(0, _Finder(site, real, shells, overrides or {}, extra_stubs))


def arm():
    """From now on any use of a stub raises StubUsed."""
    _armed[0] = True
