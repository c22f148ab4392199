"""Test accuracy of the float32 and bfloat16 runs of run.sh: mean, sample standard deviation, and whether the
bfloat16 mean lies within two float32 standard deviations of the float32 mean (the check performance IV asks for)."""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bf16_accuracy")
acc, wall = {}, {}
for dtype in ("float32", "bfloat16"):
    runs = sorted((out / dtype).glob("s*/summary.json"))
    acc[dtype] = [json.loads(p.read_text())["test_accuracy"] * 100 for p in runs]
    wall[dtype] = [json.loads(p.read_text())["wall_s"] for p in runs]
    print(f"{dtype:9s} test accuracy % by seed: {', '.join(f'{a:.2f}' for a in acc[dtype])}; "
          f"mean {statistics.mean(acc[dtype]):.2f} ± {statistics.stdev(acc[dtype]):.2f} (sample std); "
          f"wall s by seed: {', '.join(f'{w:.1f}' for w in wall[dtype])}")
m32, s32 = statistics.mean(acc["float32"]), statistics.stdev(acc["float32"])
m16 = statistics.mean(acc["bfloat16"])
print(f"bfloat16 - float32: {m16 - m32:+.2f} points = {(m16 - m32) / s32:+.2f} float32 std: "
      f"{'within' if abs(m16 - m32) <= 2 * s32 else 'NOT within'} 2 std")
