"""FP8 scaling state of a cleave checkpoint, read from its fp8-state.safetensors (checkpoint
format 4) as {linear: {"scales": [x, w, dy], "amax_history": [[x, w, dy], ...]}}."""
import json
import struct

import numpy as np


def fp8_state(checkpoint):
    meta = json.load(open(f"{checkpoint}/meta.json"))
    data = open(f"{checkpoint}/{meta['fp8']['file']}", "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    names = json.loads(header["__metadata__"]["names"])

    def tensor(key):
        t = header[key]
        a, b = t["data_offsets"]
        return np.frombuffer(body[a:b], dtype="<f4").reshape(t["shape"])

    scales, history = tensor("scales"), tensor("amax_history")
    out = {}
    for i, name in enumerate(names):
        out[name] = {"scales": [float(v) for v in scales[i]]}
        if meta["fp8"]["recipe"] == "delayed":
            out[name]["amax_history"] = [[float(v) for v in step[i]] for step in history]
    return out
