"""identify's layer mode is a probe of its own (`layer_identify`), run by module path from
`layer_study`; its document stays an ordinary identify document, and the battery probe
(`identify.battery`) refuses layers rather than answer with the battery."""

import pytest

from convprobe.backends.configurations import emulated_config
from convprobe.backends.emulated import EmulatedBackend
from convprobe.errors import InvalidArgument
from convprobe.identify.layer_study import run_layer_identify
from convprobe.identify import battery
from convprobe.probes.layers import Layer

SPEC = "sequential:fp32:output=fp16"
LAYER = Layer((1, 4, 4, 4), (3, 3, 4, 4))


def test_a_layer_map_is_an_identify_document():
    config = emulated_config(SPEC)
    outcome = run_layer_identify([config], [LAYER], specs=None, seed=0, device="cpu", timeout=60, jobs=1)
    document = outcome.document
    assert document["kind"] == "identify" and document["params"]["layers"] == [LAYER.to_dict()]
    assert [r["probe"] for r in document["results"]] == ["identify"]
    assert [row["op"] for row in outcome.rows] == list(LAYER.ops)
    assert {row["match"] for row in outcome.rows} == {"100.0%"}, outcome.rows


def test_the_battery_refuses_layers():
    with pytest.raises(InvalidArgument, match="convprobe.identify.layer_identify"):
        battery.run(EmulatedBackend(SPEC), layers=[LAYER.to_dict()])
