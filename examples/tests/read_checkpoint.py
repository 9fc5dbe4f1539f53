"""Reads a checkpoint and the exported model with Python's `safetensors` (an independent
reader of the format) and checks them against each other. Prints one JSON object."""
import json
import sys
import zlib

import numpy as np
from safetensors import safe_open

checkpoint, model = sys.argv[1], sys.argv[2]
out = {}
with safe_open(checkpoint, "numpy") as ck:
    meta = ck.metadata()
    out["format"] = meta["format"]
    out["next_step"] = int(meta["next_step"])
    out["strategy"] = json.loads(meta["identity"])["strategy"]
    names = list(ck.keys())
    out["tensors"] = len(names)
    out["nodes"] = len(json.loads(meta["nodes"]))
    node0 = {n: ck.get_tensor(n) for n in names if n.startswith("node0/model/")}
with open(checkpoint, "rb") as f:
    raw = f.read()
header = int.from_bytes(raw[:8], "little")
out["crc_matches"] = meta["crc32"] == "crc32:%08x" % zlib.crc32(raw[8 + header:])
with safe_open(model, "numpy") as m:
    exported = {n: m.get_tensor(n) for n in m.keys()}
out["model_tensors"] = sorted(exported)
# PyTorch's layout: a Linear weight is [out, in], Burn's [in, out].
same = []
for name, value in exported.items():
    burn = node0["node0/model/" + name]
    same.append(bool(np.array_equal(value.T if value.ndim == 2 else value, burn)))
out["model_equals_node0"] = all(same) and len(same) == len(node0)
out["fc1_shape"] = list(exported["fc1.weight"].shape)
print(json.dumps(out))
