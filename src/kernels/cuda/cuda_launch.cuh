/*
 * cuda_launch.cuh — how every kernel of the CUDA backend is launched: with programmatic dependent launch (PDL,
 * compute capability 9.0; CUDA programming guide, "Programmatic Dependent Launch and Synchronization").
 *
 * A decode step is a chain of ~25 small kernels per layer on one stream. Without PDL the device starts a kernel only
 * after the one before it has drained; with it the next kernel's blocks are scheduled while the last wave of the one
 * before runs, and wait on the device (griddepcontrol.wait) until that kernel has finished and its writes are
 * visible. Every kernel begins with pdl_enter(): the wait first (so no kernel reads or writes memory before its
 * predecessor has completed: the same order, the same bits as plain launches), then the signal that lets its own
 * successor be scheduled. Both instructions are no-ops in a kernel launched without the attribute.
 *
 * DF_CUDA_PDL=0|off (docs/cuda.md; cuda_env.h) launches without the attribute: a developer comparison.
 */
#ifndef DF_KERNELS_CUDA_LAUNCH_CUH
#define DF_KERNELS_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <utility>

/* 1: kernels are launched with the PDL attribute (the default); 0: plain launches (cuda_ops.cu; set by the runtime's
 * probe from DF_CUDA_PDL). */
extern int g_cu_pdl;

/* The first statement of every kernel: wait for the kernel before it in the stream to complete (its memory visible),
 * then allow the next kernel's blocks to be scheduled. */
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, st>>>(args...) with the PDL attribute when g_cu_pdl is set; the launch's error as
 * cudaLaunchKernelEx returns it (also what cudaGetLastError reports next). */
template <typename... P, typename... A>
static inline cudaError_t cu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = g_cu_pdl ? 1 : 0;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif
