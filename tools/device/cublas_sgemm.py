#!/usr/bin/env python3
# cublas_sgemm.py — the fp32 GEMM baseline for `deltafin bench kernels --backend cuda`: y[T,rows] = x[T,cols] W^T
# through PyTorch (cuBLAS SGEMM, TF32 off: every product and sum in fp32) on the same shapes, CUDA events over
# back-to-back calls after a warm-up. Usage (on the accelerator machine): python3 cublas_sgemm.py [RxC ...] [--T 1,8,512]
import sys
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
args = sys.argv[1:]
Ts = [1, 8, 512]
if "--T" in args:
    i = args.index("--T")
    Ts = [int(v) for v in args[i + 1].split(",")]
    del args[i:i + 2]
shapes = [tuple(int(v) for v in a.split("x")) for a in args] or [(2048, 7168), (7168, 2048), (32768, 7168)]
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
print(f"{'shape':<12} {'T':>5} {'ms/call':>10} {'TFLOP/s':>9}")
for R, C in shapes:
    W = torch.randn(R, C, device="cuda", dtype=torch.float32)
    for T in Ts:
        x = torch.randn(T, C, device="cuda", dtype=torch.float32)
        iters = 5 if T >= 256 and R * C > 1e8 else 50
        y = x @ W.t()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            y = x @ W.t()
        e1.record()
        e1.synchronize()
        ms = e0.elapsed_time(e1) / iters
        print(f"{R}x{C:<7} {T:>5} {ms:>10.4f} {2.0 * R * C * T / (ms * 1e-3) / 1e12:>9.2f}", flush=True)
