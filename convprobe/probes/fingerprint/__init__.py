"""The fingerprint battery: crafted sums that reveal how an op really accumulates.

Every test is a sum of a few crafted fp16 products placed at chosen positions
along the reduction axis (zeros elsewhere), run through an op as M independent
dot products (`fingerprint_ops.reduce_rows`). What each test decides:

- accumulator_bits - significand bits a partial sum keeps. Row j sums
  big = 2**15, tiny = 2**(15-j) and -big; tiny survives iff the partial sum
  big + tiny was representable, i.e. j <= p - 1 (j = p is a tie that
  nearest-even and truncation both lose). p = 1 + the largest j up to which every
  tiny survived; >= 40 means no rounding was seen (fp16 inputs cannot show
  more). Measured in four orderings: `spread` (big, tiny first, -big last),
  `adjacent` (three in a row), `reversed` (mirror of spread, for reductions
  that run backwards) and `cancel_first` (big, -big, tiny), which cancels before
  any rounding and so *hides* a narrow accumulator: order matters.
  The accumulator is the narrowest of the first three; `adjacent` wider than
  `spread` means a fused multi-term adder (block FMA) whose alignment keeps
  `extra_bits` more bits than its accumulator.
- lanes - big, tiny at every distance d < 62 and -big at 63 or 62: where narrow
  SIMD lanes are summed in a wider format, tiny is lost exactly when d is a multiple
  of the lane count W (it shares big's lane). The accumulator is then the lane's,
  measured by the `strided` ordering and rounding rows (every term at a multiple of
  16, so in one lane when W divides 16), and the accumulation reads "fp16 in W
  lanes, summed in fp32" (TensorFlow's oneDNN-off input gradient: Eigen's
  vectorised half dot product).
- rounding - at the measured p: big = 1.5 * 2**15, t = 0.75, 0.25 and 0.5 ulp
  (ties on an even and on an odd last bit), and -(big + 0.75 ulp); 16 copies of
  the 0.75 and 0.25 rows expose stochastic rounding (copies disagree).
- product_bits - (1 + 2**-i)(1 + 2**-i2) * 2**10 needs n = i + i2 + 1
  significand bits; added to -(1 + 2**-i + 2**-i2) * 2**10 it leaves
  2**(10-i-i2) iff the product was kept (n = 3..21); both operand orders, the
  best counts (an fp16 accumulator loses it in one order).
- double_rounding - for an fp16 accumulator: (1 + 2**-10) + 2**-11 (1 - 2**-20)
  is just below a tie; added in fp32 first it lands on the tie and rounds to
  even, up (an fp16 add done as float-add-then-convert, as CPU half types do).
- subnormal inputs (2**-24 * 2**10) and results (2**-7 * 2**-10 = 2**-17): kept
  or flushed to zero.
- overflow - 65504 + 32 = 65536 becomes inf or saturates to 65504;
  accumulator_range - 65504 + 65504 - 65504 is inf/0 in an fp16-range
  accumulator, 65504 in a wider one; product_overflow - the 65519 test
  (0 wide, inf fp16 fused chain, NaN fp16 products).
- block_size - +P and -P (P = 65504**2) at distance d: a fused block holding
  both gives 0, separate accumulation steps overflow (inf; NaN when two
  partial sums overflow separately: a tree). The smallest d that overflows is the
  block size; for wide accumulators with extra alignment bits the same sweep
  runs on tiny = 2**(15-(p+1)) between big and -big at distance d. Where neither
  shows a block, the alignment sweep does: 2**10 and -2**10 first, then
  x = 2**-8 + 2**-18 at distance d. A truncating block adder aligns x to 2**10 and
  drops its last bit while x shares a block with them, and keeps x whole once it
  starts a block of its own: the first d that keeps x is the block size.
- chunk_size - big first, -big last, tiny at distance d: tiny survives once it
  starts a new chunk that is summed separately and promoted to a wider total.

References: the 65519 test (DESIGN.md); block FMA models of tensor cores
(Fasi, Higham, Mikaitis & Pranesh, PeerJ Comput. Sci. 7:e330, 2021); chunked
accumulation (Blanchard et al., SIAM J. Sci. Comput. 42(3), 2020).

The package splits the work by role: `battery` (the crafted rows), `execution`
(running them, child side), `properties` (one small function per property, each
returning a typed `Finding` with its evidence), `inference` (the properties in
dependency order, rendered for the table), `expected` (what a model must give) and
`scheduling` (configurations to processes).
"""

from __future__ import annotations

from convprobe.probes.fingerprint.battery import DISTANCES, ORDERINGS, PROPERTIES, Group, battery
from convprobe.probes.fingerprint.execution import run, run_all, run_battery
from convprobe.probes.fingerprint.expected import expected_properties, resolved_size
from convprobe.probes.fingerprint.inference import fingerprint_backend, findings_observed, infer, infer_observed, interpret
from convprobe.probes.fingerprint.scheduling import run_grouped

__all__ = [
    "PROPERTIES", "ORDERINGS", "DISTANCES", "Group", "battery", "run", "run_all", "run_battery", "infer",
    "infer_observed", "findings_observed", "interpret", "fingerprint_backend", "expected_properties", "resolved_size", "run_grouped",
]
