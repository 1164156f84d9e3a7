"""convprobe: what arithmetic does an fp16 convolution really do?

Importing convprobe never imports TensorFlow; the backends and the training
harness import it lazily, where it is used.
"""

from convprobe.errors import ConvprobeError, InvalidArgument, UnsupportedConfiguration
from convprobe.formats import FORMATS, Format, parse_format

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ConvprobeError",
    "InvalidArgument",
    "UnsupportedConfiguration",
    "FORMATS",
    "Format",
    "parse_format",
]
