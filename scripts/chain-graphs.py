#!/usr/bin/env python3
"""Writes the two graphs of issue 21's `compile --report` timing: a chain of tanh → softmax
pairs (20,000 nodes by default) and a chain of one unary op (1,000,000 nodes by default).
Each op over the same shape generates the same kernel, so the plans hold many kernels and few
distinct ones. Usage: scripts/chain-graphs.py DIR [PAIRS_NODES] [UNARY_NODES]
Then: rocmforge compile DIR/tanh_softmax_chain.json --target gfx90a --report"""

import json
import os
import sys


def write(path, name, nodes, out):
    with open(path, "w") as f:
        json.dump(
            {"format": "rocmforge-graph", "version": 1, "name": name, "nodes": nodes,
             "outputs": [out]},
            f,
        )


def main():
    d = sys.argv[1]
    pairs_nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    unary_nodes = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    os.makedirs(d, exist_ok=True)
    x = {"name": "x", "op": "input", "dtype": "f32", "shape": [8, 1024]}

    nodes, prev = [x], "x"
    for i in range(pairs_nodes):
        n = f"n{i}"
        if i % 2 == 0:
            nodes.append({"name": n, "op": "tanh", "inputs": [prev]})
        else:
            nodes.append({"name": n, "op": "softmax", "inputs": [prev], "axis": -1})
        prev = n
    write(os.path.join(d, "tanh_softmax_chain.json"), "tanh_softmax_chain", nodes, prev)

    nodes, prev = [x], "x"
    for i in range(unary_nodes):
        n = f"n{i}"
        nodes.append({"name": n, "op": "tanh", "inputs": [prev]})
        prev = n
    write(os.path.join(d, "tanh_chain.json"), "tanh_chain", nodes, prev)


main()
