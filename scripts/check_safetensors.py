#!/usr/bin/env python3
"""Checks a model murmur exported against the parameters it should hold.

    check_safetensors.py MODEL.safetensors LAYOUT.json PARAMS.f32

MODEL.safetensors is the file `[training] export` wrote. LAYOUT.json lists the model's
tensors in the order they lie in murmur's flat parameter vector:
{"tensors": [{"name": "...", "shape": [..]}, ...]}. PARAMS.f32 is that flat vector as
little-endian float32 (for instance the "params" tensor of the checkpoint written at exit).

The file is loaded with the safetensors package's numpy backend. It must hold exactly the
layout's tensors, each float32 with the layout's shape, and every value must equal the
corresponding parameter bit for bit. Exits 0 when it does; 1 naming each difference when it
does not, or when the file does not load; 2 when the layout or parameters cannot be read.
"""

import json
import sys

import numpy as np
from safetensors.numpy import load_file

MAX_REPORTED = 20


def read_expected(layout_path, params_path):
    with open(layout_path, encoding="utf-8") as f:
        layout = json.load(f)["tensors"]
    params = np.fromfile(params_path, dtype="<f4")
    return layout, params


def differences(tensors, layout, params):
    """Every way the loaded tensors differ from the layout and the parameters."""
    problems = []
    names = [spec["name"] for spec in layout]
    for name in sorted(set(tensors) - set(names)):
        problems.append(f"{name}: in the file but not in the layout")
    offset = 0
    for spec in layout:
        name, shape = spec["name"], tuple(spec["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        expected = params[offset : offset + count]
        offset += count
        got = tensors.get(name)
        if got is None:
            problems.append(f"{name}: missing from the file")
            continue
        if got.dtype != np.float32:
            problems.append(f"{name}: dtype {got.dtype}, expected float32")
            continue
        if got.shape != shape:
            problems.append(f"{name}: shape {list(got.shape)}, expected {list(shape)}")
            continue
        if expected.size != count:
            continue  # reported below, with the parameter count
        # Bit for bit: compare the raw 32-bit patterns, so -0.0 and NaN payloads count too.
        same = got.reshape(-1).view(np.uint32) == expected.view(np.uint32)
        if not same.all():
            wrong = np.flatnonzero(~same)
            first = int(wrong[0])
            problems.append(
                f"{name}: {wrong.size} of {count} values differ; first at flat index "
                f"{first}: {got.reshape(-1)[first]!r} in the file, {expected[first]!r} expected"
            )
    if offset != params.size:
        problems.append(f"the layout covers {offset} parameters, the parameter file has {params.size}")
    return problems


def main(argv):
    if len(argv) != 4:
        print(f"usage: {__doc__.strip().splitlines()[2].strip()}", file=sys.stderr)
        return 2
    model_path, layout_path, params_path = argv[1:]
    try:
        layout, params = read_expected(layout_path, params_path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"check_safetensors: cannot read the layout or parameters: {e}", file=sys.stderr)
        return 2
    try:
        tensors = load_file(model_path)
    except Exception as e:  # safetensors raises its own error types for malformed files
        print(f"check_safetensors: {model_path} does not load: {e}", file=sys.stderr)
        return 1
    problems = differences(tensors, layout, params)
    if problems:
        for problem in problems[:MAX_REPORTED]:
            print(f"check_safetensors: {problem}", file=sys.stderr)
        if len(problems) > MAX_REPORTED:
            print(f"check_safetensors: and {len(problems) - MAX_REPORTED} more", file=sys.stderr)
        return 1
    print(f"ok: {len(layout)} tensors, {params.size} values equal bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
