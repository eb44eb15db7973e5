"""Where the graph-timed GEMM floor of this run (~5 us at m <= 384, n = k = 1024) comes
from: the same GEMMs in CUDA graphs of 32 calls, weights L2-warm (one copy) or cold (128
copies cycled, 256 MiB+ past the 60 MB L2), beside a graph of 32 one-element adds (the
per-kernel cost of a graph replay alone). Prints one CSV row per case; run on a GPU:
python calibration/runs/h200-2026-12-04/floor_probe.py > floor_probe.csv"""

import statistics

import torch

OPS = 32
REPS = 30


def replay_us(fn_list) -> float:
    """Median microseconds per op over REPS replays of a graph calling fn_list in turn."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fn_list[:3]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fn_list:
            f()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fn_list))
    return statistics.median(times)


def main() -> None:
    dev = "cuda"
    print("case,m,n,k,copies,us_per_op")
    one = torch.zeros(1, device=dev)
    print(f"add_1_element,0,0,0,1,{replay_us([lambda: one.add_(1.0)] * OPS):.3f}")
    for n, k in ((1024, 1024), (4096, 4096)):
        for m in (1, 8, 64, 256):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            for copies in (1, 128):
                ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
                outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]
                fns = [
                    (lambda x=x, w=ws[i % copies], o=outs[i % 2]: torch.matmul(x, w.t(), out=o))
                    for i in range(OPS if copies == 1 else copies)
                ]
                print(f"gemm_bf16,{m},{n},{k},{copies},{replay_us(fns):.3f}")
                del ws, outs, fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
