"""Reads a safetensors file with torch alone (torch 1.13 has no safetensors loader): checks the
header, builds each tensor with torch.frombuffer and prints {name: {shape, sum, first}} as JSON,
plus the __metadata__ object. Used by test_checkpoint_train to check zrt-ckpt export."""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def main(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = bytearray(data[8 + header_len :])
    out = {"__metadata__": header.pop("__metadata__", {})}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(body[begin:end], dtype=DTYPES[entry["dtype"]])
        t = t.reshape(entry["shape"])
        out[name] = {
            "shape": list(t.shape),
            "sum": t.double().sum().item(),
            "first": t.reshape(-1)[0].item(),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
