"""Importing TensorFlow for training, with the environment set first.

XLA reads `XLA_FLAGS` once, when TensorFlow first initialises it, and logical
devices must be configured before TensorFlow initialises its devices. So the
harness never imports TensorFlow at module level: `tensorflow()` puts the
faithful-fp16 flags into `XLA_FLAGS` first, then imports TensorFlow and, if
asked, splits the CPU into logical devices.

The flags (measured on TF 2.21, CPU with AVX512-FP16; see `xla_rounds_fp16`):
- `--xla_allow_excess_precision=false`: XLA may otherwise keep an fp16
  intermediate in fp32 inside a fusion.
- `--xla_cpu_max_isa=AVX2`: on a CPU with AVX512-FP16, XLA's LLVM backend
  contracts an fp16 multiply and add into one native fp16 FMA (one rounding
  instead of two), so `x*x + h - 1` comes out one fp16 ulp different from
  TensorFlow without jit, and `--xla_allow_excess_precision=false` alone does
  not prevent it. Capping the ISA at AVX2 makes XLA compute f16 elementwise ops
  through f32 with a rounding to f16 after each op.
Two more flags only make compilation faster on a small CPU (measured: the
first fp16 ResNet-8 telemetry step compiles in ~11 s instead of ~35 s on two
cores) and do not change the arithmetic, which `xla_rounds_fp16` re-checks:
`--xla_cpu_parallel_codegen_split_count=1`, `--xla_cpu_use_thunk_runtime=false`.
`runtime_facts()` records what actually happened, including the direct check.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import sys
import tempfile

from convprobe.backends.configurations import MANAGED_VARIABLES, MATRIX
from convprobe.errors import InvalidArgument, invalid_choice

__all__ = ["FAITHFUL_XLA_FLAGS", "SPEED_XLA_FLAGS", "ensure_xla_flags", "apply_configuration",
           "configuration_in_effect", "tensorflow",
           "start_up_notices_dropped",
           "runtime_facts", "xla_rounds_fp16"]

FAITHFUL_XLA_FLAGS = ("--xla_allow_excess_precision=false", "--xla_cpu_max_isa=AVX2")
SPEED_XLA_FLAGS = ("--xla_cpu_parallel_codegen_split_count=1", "--xla_cpu_use_thunk_runtime=false")

_state: dict = {"flag_set_before_import": None, "logical_devices": None, "configuration": None}


def apply_configuration(name: str, environ: dict | None = None, *, argument: str = "--config") -> dict[str, str]:
    """Set the environment of the TensorFlow configuration `name` (a row of `convprobe
    fingerprint --list-configs`), as identify's child processes do: the switches the
    matrix manages are removed, then the row's are set, and XLA_FLAGS is the row's plus
    the compile-speed flags only, so the run computes in the configuration identify
    measured. Must run before TensorFlow is imported; returns what was set. `argument`
    names the configuration in messages (the option, or a Python keyword)."""
    env = os.environ if environ is None else environ
    if name not in MATRIX["cpu"]:
        raise invalid_choice(argument, name, tuple(MATRIX["cpu"]))
    if environ is None and "tensorflow" in sys.modules and _state["configuration"] != name:
        raise InvalidArgument(f"{argument} {name} must be set before TensorFlow starts; this process already "
                              f"imported it: set it first thing, or run in a fresh process")
    settings, _jit, _accumulate, _note = MATRIX["cpu"][name]
    for variable in MANAGED_VARIABLES:
        env.pop(variable, None)
    env.update(settings)
    env["XLA_FLAGS"] = " ".join([*settings.get("XLA_FLAGS", "").split(), *SPEED_XLA_FLAGS])
    if environ is None:
        _state["configuration"] = name
    return {k: env[k] for k in sorted(set(settings) | {"XLA_FLAGS"})}


def configuration_in_effect(environ: dict | None = None) -> str:
    """The configuration this process's TensorFlow runs: the one `apply_configuration` set, or
    the row whose switches the environment holds (`default` where it holds none of them); one
    line naming the switches where no row has them."""
    env = os.environ if environ is None else environ
    if environ is None and _state["configuration"] is not None:
        return _state["configuration"]
    held = {name: env[name] for name in MANAGED_VARIABLES if name in env and name != "XLA_FLAGS"}
    for name, (settings, *_rest) in MATRIX["cpu"].items():
        if {k: v for k, v in settings.items() if k != "XLA_FLAGS"} == held:
            return name
    raise InvalidArgument(f"this process's TensorFlow switches ({', '.join(f'{k}={v}' for k, v in held.items())}) "
                          f"are no configuration of --list-configs: choose one with convprobe.configure(NAME) "
                          f"before TensorFlow starts, or name it with configuration=")


def ensure_xla_flags(environ: dict | None = None) -> bool:
    """Add the faithful-fp16 (and compile-speed) flags to XLA_FLAGS unless the user
    already chose a value for them.

    Returns True if all faithful flags are (now) present. A user's explicit value
    for one of these flags is respected (and recorded in provenance).
    """
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "").split()
    for wanted in FAITHFUL_XLA_FLAGS + SPEED_XLA_FLAGS:
        name = wanted.split("=", 1)[0]
        if not any(f.split("=", 1)[0] == name for f in flags):
            flags.append(wanted)
    env["XLA_FLAGS"] = " ".join(flags)
    return all(w in flags for w in FAITHFUL_XLA_FLAGS)


#: TensorFlow's start-up notices on a CPU machine: nothing a user can act on.
_START_UP_NOTICES = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR|"
    rb"^[IWE]\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] (Could not find cuda drivers|failed call to cuInit|oneDNN custom "
    rb"operations are on|This TensorFlow binary is optimized|Unable to register cu(DNN|FFT|BLAS) factory|"
    rb"oneDNN supports DT_HALF only on platforms with AVX-512)|"
    rb"^To enable the following instructions:|^All log messages before absl::InitializeLog")


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is an OSError)
        return False
    return True


@contextlib.contextmanager
def start_up_notices_dropped():
    """Run the block with file descriptor 2 captured, then write back every line but
    TensorFlow's start-up notices (which its C++ runtime prints before TF_CPP_MIN_LOG_LEVEL
    applies): an error, a warning of substance and a traceback still reach stderr. A
    process killed by a signal inside the block loses what it wrote there; faulthandler
    writes its Python traceback to the real stderr meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    was_enabled = faulthandler.is_enabled()
    with tempfile.TemporaryFile() as captured, os.fdopen(os.dup(saved), "w", closefd=True) as real_stderr:
        os.dup2(captured.fileno(), 2)
        faulthandler.enable(file=real_stderr)  # a crash inside still shows its Python traceback
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if was_enabled:  # (where sys.stderr is a capture with no file descriptor: the process's own)
                faulthandler.enable(file=sys.stderr if _has_fileno(sys.stderr) else sys.__stderr__)
            else:
                faulthandler.disable()
            captured.seek(0)
            kept = [line for line in captured if not _START_UP_NOTICES.search(line)]
            if kept:
                os.write(2, b"".join(kept))


def tensorflow(logical_devices: int | None = None, *, initialise: bool = True):
    """Import TensorFlow with faithful-fp16 XLA flags; optionally split the CPU.

    `logical_devices` > 1 configures that many logical CPU devices; it only works
    before TensorFlow initialised its devices (a fresh process), and raises
    RuntimeError otherwise.
    """
    already = "tensorflow" in sys.modules
    # idempotent; provenance reads os.environ. A named configuration keeps its own XLA flags.
    present = ensure_xla_flags() if _state["configuration"] is None else False
    if _state["flag_set_before_import"] is None:
        _state["flag_set_before_import"] = present and not already
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with start_up_notices_dropped() if not already else contextlib.nullcontext():
        import keras  # noqa: F401  (its import starts TensorFlow's runtime too)
        import tensorflow as tf

        if logical_devices and logical_devices > 1 and _state["logical_devices"] != logical_devices:
            cpu = tf.config.list_physical_devices("CPU")[0]
            existing = tf.config.get_logical_device_configuration(cpu)
            if existing is None or len(existing) != logical_devices:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_devices)]
                )
            _state["logical_devices"] = logical_devices
        if initialise and not already:  # not before a MultiWorkerMirroredStrategy: it must come first
            tf.config.list_logical_devices()  # initialises the devices: the CUDA probe prints here
            half = tf.zeros([1, 1, 1, 1], tf.float16)  # the first fp16 conv: oneDNN's notice about this CPU
            tf.nn.conv2d(half, half, 1, "VALID")
    return tf


def xla_rounds_fp16() -> bool:
    """Does jit-compiled fp16 arithmetic round to fp16 between ops?

    x = 1 + 3*2^-10 and h = 2^-11 are exact in fp16. Rounded op by op,
    x*x = 1 + 6*2^-10 (the 9*2^-20 is below half an ulp), + h is a tie that
    rounds to even (1 + 6*2^-10), and - 1 gives 6*2^-10. With the product
    kept wider (fp32 excess precision or an fp16 FMA), x*x + h lies above the
    tie and rounds to 1 + 7*2^-10, giving 7*2^-10.
    """
    tf = tensorflow()
    x = tf.constant([1.0 + 3.0 * 2.0**-10] * 8, dtype=tf.float16)
    h = tf.constant(2.0**-11, tf.float16)
    one = tf.constant(1.0, tf.float16)

    @tf.function(jit_compile=True)
    def probe(v):
        return (v * v + h) - one

    got = probe(x).numpy().astype("float64")
    return bool((got == 6.0 * 2.0**-10).all())


def runtime_facts() -> dict:
    """What provenance should say about the runtime this process really has."""
    facts = {
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "xla_flag_set_before_tensorflow_import": _state["flag_set_before_import"],
        "logical_devices": _state["logical_devices"],
        "configuration": _state["configuration"],
    }
    if "tensorflow" in sys.modules:
        tf = sys.modules["tensorflow"]
        facts["tensorflow_devices"] = [d.name for d in tf.config.list_logical_devices()]
        try:
            facts["xla_rounds_fp16_between_ops"] = xla_rounds_fp16()
        except Exception as error:  # a runtime without XLA: say so rather than fail the run
            facts["xla_rounds_fp16_between_ops"] = f"unavailable: {type(error).__name__}"
    return facts
