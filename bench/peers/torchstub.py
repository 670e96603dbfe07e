"""torchstub.py — the few names of `torch` that SGLang's RadixCache touches on
the paths the replay reaches, without torch.

Owns: a module object installed as `torch` for the SGLang replay only. What the
reached code does with it: `torch.device("cpu")` and `torch.empty((0,), ...)` in
RadixCache.__init__/reset, annotations, and `.clone()`/slicing/len() of the
per-node KV-index rows (`TreeNode.value`), which in SGLang are int64 tensors and
here are `array('q')` rows: slicing an array is cheaper than slicing a tensor,
so this stub can only make SGLang look faster than it is. Anything else raises.
"""
import types
from array import array

int64 = "int64"
int32 = "int32"


class device(str):
    def __new__(cls, d="cpu"):
        return str.__new__(cls, str(d))

    @property
    def type(self):
        return str(self).split(":")[0]


class Tensor:
    """An int64 row: len, contiguous slices (copies, like a view + clone) and clone."""

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a

    def __len__(self):
        return len(self.a)

    def __getitem__(self, s):
        if isinstance(s, slice):
            return Tensor(self.a[s])
        return self.a[s]

    def clone(self):
        return Tensor(self.a)  # slices are already copies: nothing shares storage


def empty(shape, dtype=None, device=None):
    return Tensor(array("q", bytes(8 * shape[0])))


def tensor(data, dtype=None, device=None):
    return Tensor(array("q", data))


def _raise(name):
    def f(*a, **k):
        raise RuntimeError(f"torch stub: torch.{name} is not stubbed (reached?)")
    return f


def make_module():
    m = types.ModuleType("torch")
    for k in ("int64", "int32", "device", "Tensor", "empty", "tensor"):
        setattr(m, k, globals()[k])
    m.distributed = types.SimpleNamespace(ProcessGroup=object)
    m.__getattr__ = lambda name: _raise(name)
    return m
