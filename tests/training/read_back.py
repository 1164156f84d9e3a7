"""Reading a run's records back in tests: CSV rows, and TensorBoard event files by tag."""

import csv
import glob


def rows(path):
    """The CSV file's rows as dicts."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def events(directory):
    """{tag: [(step, plugin name, value array)]} of the event files in directory/tensorboard."""
    import tensorflow as tf

    tags = {}
    for path in glob.glob(str(directory / "tensorboard" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append((event.step, value.metadata.plugin_data.plugin_name,
                                                       tf.make_ndarray(value.tensor)))
    return tags
