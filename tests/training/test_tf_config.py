"""`read_tf_config` checks every value's type of TF_CONFIG before TensorFlow starts (no TensorFlow here)."""

from __future__ import annotations

import json

import pytest

from convprobe.errors import InvalidArgument
from convprobe.training.cluster import Cluster, read_tf_config

TWO = ["10.0.0.1:2222", "10.0.0.2:2222"]


def _config(workers=TWO, task=None) -> dict[str, str]:
    task = {"type": "worker", "index": 0} if task is None else task
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": task})}


@pytest.mark.parametrize("task", [
    {"type": "worker", "index": True},
    {"type": "worker", "index": False},
    {"type": "worker", "index": 1.0},
    {"type": "worker", "index": "1"},
    {"type": "worker", "index": None},
    {"type": "worker", "index": -1},
    {"type": "worker", "index": 2},
    {"type": "chief", "index": 0},
    {"type": "ps", "index": 0},
    {"type": 0, "index": 0},
], ids=repr)
def test_a_task_that_is_not_a_worker_with_an_integer_index_is_refused(task):
    with pytest.raises(InvalidArgument) as error:
        read_tf_config(_config(task=task))
    assert str(error.value) == f"TF_CONFIG's task must be a worker with an index from 0 to 1; received {task!r}"


@pytest.mark.parametrize("worker", [
    "host", "host:", ":2222", "host:0", "host:65536", "host:port", "host:22.5", "host:+22", "host:-1",
    "host:\u0662\u0662", 2222, None, ["host", 2222],
], ids=repr)
def test_a_worker_that_is_not_host_and_port_is_refused(worker):
    workers = [TWO[0], worker]
    with pytest.raises(InvalidArgument) as error:
        read_tf_config(_config(workers=workers))
    assert str(error.value) == (f"TF_CONFIG's cluster.worker must be a list of host:port, each port from 1 to "
                                f"65535; received {workers!r}")


def test_a_worker_listed_twice_is_refused():
    workers = [TWO[0], TWO[1], TWO[0]]
    with pytest.raises(InvalidArgument, match=r"must list each host:port once; received \[") as error:
        read_tf_config(_config(workers=workers))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("text", [
    "[]", '"worker"', '{"cluster": [], "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"worker": ["a:1", "b:1"]}, "task": [0]}', '{"cluster": {"worker": ["a:1", "b:1"]}}',
])
def test_json_of_the_wrong_shape_is_refused(text):
    with pytest.raises(InvalidArgument, match="TF_CONFIG must be JSON like"):
        read_tf_config({"TF_CONFIG": text})


def test_a_well_formed_tf_config_is_read():
    workers = ["10.0.0.1:1", "[::1]:65535", "worker-2.example:2222"]
    cluster = read_tf_config(_config(workers=workers, task={"type": "worker", "index": 2}))
    assert cluster == Cluster(tuple(workers), 2) and not cluster.is_chief
    assert type(cluster.index) is int
    assert read_tf_config(_config()).is_chief
