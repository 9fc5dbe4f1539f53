"""Reads a folder of TensorBoard event files with Python's `tensorboard` package (an
independent reader of the format) and prints one JSON object:

  {"runs": {RUN: {"scalars": {TAG: [[STEP, VALUE], ...]}, "hparams": {NAME: VALUE}}},
   "experiment": {"hparams": [NAME, ...], "metrics": [TAG, ...]}}

Scalars come from the classic `EventAccumulator`, which checks every record's CRCs; the
hyper-parameters and the experiment from the path TensorBoard's server takes for its HParams
tab (the plugin multiplexer, its data provider and the hparams plugin's backend context)."""
import json
import os
import sys

from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import backend_context, metadata

logdir = sys.argv[1]


def value(v):
    """A google.protobuf.Value as a JSON value."""
    kind = v.WhichOneof("kind")
    return getattr(v, kind) if kind else None


mux = plugin_event_multiplexer.EventMultiplexer()
mux.AddRunsFromDirectory(logdir)
mux.Reload()
runs = {}
for run in sorted(mux.Runs()):
    acc = event_accumulator.EventAccumulator(
        os.path.join(logdir, run), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
    }
    runs[run] = {"scalars": scalars, "hparams": {}}

provider = data_provider.MultiplexerDataProvider(mux, logdir)
context = backend_context.Context(
    base_plugin.TBContext(data_provider=provider, multiplexer=mux, logdir=logdir)
)
request = tb_context.RequestContext()
content = context.hparams_metadata(request, "")
for run, tags in content.items():
    if metadata.SESSION_START_INFO_TAG in tags:
        info = metadata.parse_session_start_info_plugin_data(
            tags[metadata.SESSION_START_INFO_TAG]
        )
        runs.setdefault(run, {"scalars": {}, "hparams": {}})["hparams"] = {
            name: value(v) for name, v in info.hparams.items()
        }
experiment = context.experiment_from_metadata(
    request, "", True, content, context.hparams_from_data_provider(request, "", None)
)
print(
    json.dumps(
        {
            "runs": runs,
            "experiment": {
                "hparams": sorted(h.name for h in experiment.hparam_infos),
                "metrics": sorted(m.name.tag for m in experiment.metric_infos),
            },
        }
    )
)
