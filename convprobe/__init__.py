"""convprobe: what arithmetic does an fp16 convolution really do?

Importing convprobe never imports TensorFlow; the backends and the training
harness import it lazily, where it is used.
"""

from convprobe.errors import ConvprobeError, InvalidArgument, UnsupportedConfiguration
from convprobe.formats import FORMATS, Format, parse_format

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "configure",
    "ConvprobeError",
    "InvalidArgument",
    "UnsupportedConfiguration",
    "FORMATS",
    "Format",
    "parse_format",
]


def configure(name: str) -> dict[str, str]:
    """Run this process's TensorFlow in the configuration `name`, a row of `convprobe
    fingerprint --list-configs` (e.g. "onednn-off+fp16-acc"): its switches are set in
    `os.environ`, those of the other rows removed, as `train --config` and identify's
    children do. TensorFlow reads them once, so call it before TensorFlow is imported;
    a row that runs under XLA (its name holds "jit") also needs ``jit_compile=True``.
    Returns the variables set.

    >>> import convprobe
    >>> convprobe.configure("onednn-off+fp16-acc")["TF_CONV2D_USE_FP16_ACCUMULATE"]
    '1'
    """
    # imported here: the configuration table loads NumPy and numba, and `import convprobe` stays light
    from convprobe.training.runtime import apply_configuration

    return apply_configuration(name, argument="configuration")
