# Per-shape matmul times from a bench_train --profile trace: (FLOPs, output bytes) -> calls, median µs, GFLOP/s, sum.
# The first quarter of the events (warm-up) is left out.   python3 shapes.py TRACE.json
import collections, json, statistics, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e.get("name") == "matmul"]
ev = ev[len(ev) // 4:]
d = collections.defaultdict(list)
for e in ev:
    d[(e["args"]["flops"], e["args"]["bytes"])].append(e["dur"])
for (flops, nbytes), v in sorted(d.items()):
    med = statistics.median(v)
    print(f"flops {flops:>10} out bytes {nbytes:>8}  calls {len(v):>4}  median {med:7.0f} us  {flops / med / 1e3:5.0f} GFLOP/s  sum {sum(v) / 1e3:6.1f} ms")
