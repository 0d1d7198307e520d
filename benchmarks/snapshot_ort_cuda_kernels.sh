#!/usr/bin/env bash
# Regenerate graphopt/ops/data/ort_cuda_kernels.json: the CUDA execution provider's kernel
# table (every op, opset range and element type), read from an onnxruntime-gpu wheel's own
# kernel registry on a machine WITHOUT a GPU.
#
#   bash benchmarks/snapshot_ort_cuda_kernels.sh [ORT_VERSION] [WORK_DIR]
#   (defaults: 1.31.1, /tmp/graphopt-ortgpu; writes graphopt/ops/data/ort_cuda_kernels.json)
#
# Why the stubs: onnxruntime lists kernels (get_all_opkernel_def) by creating every provider
# its build has. The CUDA provider's constructor selects and synchronizes a device, and the
# TensorRT provider's library needs TensorRT: where it cannot load, onnxruntime dereferences
# a null factory and the process crashes (what happened on the GPU machine). So the CUDA
# driver library, the few CUDA runtime calls the constructor makes, and TensorRT's entry
# points are replaced by stand-ins that report one zeroed device; nothing runs on it. The
# registry itself is static and does not depend on the device.
# Needs: python3.11 with venv, gcc, network access to PyPI (or the local wheel index).
set -euo pipefail
version="${1:-1.31.1}"
work="${2:-/tmp/graphopt-ortgpu}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/graphopt/ops/data/ort_cuda_kernels.json"
mkdir -p "$work/stubs"

if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"   # never the project's own environment
fi
"$work/venv/bin/pip" install -q "onnxruntime-gpu==$version" \
  "nvidia-cublas>=13,<14" "nvidia-cuda-runtime>=13,<14" "nvidia-cudnn-cu13" nvidia-cufft nvidia-curand "nvidia-cuda-nvrtc>=13,<14"

cd "$work/stubs"
cat > cuda.c <<'EOF'
/* The CUDA driver library's stand-in: only lets libonnxruntime_providers_cuda.so load. */
int cuTensorMapEncodeTiled(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }
int cuInit(unsigned int flags) { (void)flags; return 100; }
int cuDriverGetVersion(int *v) { if (v) *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { if (n) *n = 0; return 100; }
EOF
cat > cudart_preload.c <<'EOF'
/* Preloaded over libcudart: the calls the CUDA provider's constructor makes, answered for one
   zeroed device (900 bytes covers cudaDeviceProp of CUDA 13 and does not overrun it). */
#include <string.h>
int cudaSetDevice(int d) { (void)d; return 0; }
int cudaGetDevice(int *d) { if (d) *d = 0; return 0; }
int cudaGetDeviceCount(int *n) { if (n) *n = 1; return 0; }
int cudaGetDeviceProperties_v2(void *p, int d) { (void)d; memset(p, 0, 900); return 0; }
int cudaGetDeviceProperties(void *p, int d) { (void)d; memset(p, 0, 900); return 0; }
int cudaDeviceGetAttribute(int *v, int a, int d) { (void)a; (void)d; if (v) *v = 0; return 0; }
int cudaStreamCreateWithFlags(void **s, unsigned f) { (void)f; static int x; if (s) *s = &x; return 0; }
int cudaStreamCreate(void **s) { static int x; if (s) *s = &x; return 0; }
int cudaStreamDestroy(void *s) { (void)s; return 0; }
int cudaGetLastError(void) { return 0; }
int cudaDriverGetVersion(int *v) { if (v) *v = 13000; return 0; }
int cudaRuntimeGetVersion(int *v) { if (v) *v = 13000; return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaFree(void *p) { (void)p; return 0; }
int cudaMalloc(void **p, unsigned long n) { static char buf[64]; (void)n; if (p) *p = buf; return 0; }
int cudaMemGetInfo(unsigned long *f, unsigned long *t) { if (f) *f = 1ul << 34; if (t) *t = 1ul << 34; return 0; }
int cudaEventCreate(void **e) { static int x; if (e) *e = &x; return 0; }
int cudaEventCreateWithFlags(void **e, unsigned f) { (void)f; static int x; if (e) *e = &x; return 0; }
int cudaEventDestroy(void *e) { (void)e; return 0; }
int cudaDeviceSetLimit(int l, unsigned long v) { (void)l; (void)v; return 0; }
int cudaDeviceGetLimit(unsigned long *v, int l) { (void)l; if (v) *v = 0; return 0; }
EOF
cat > nvinfer.c <<'EOF'
/* TensorRT's entry points: let the TensorRT provider library load (its kernels are not used). */
void *createInferBuilder_INTERNAL(void *l, int v) { (void)l; (void)v; return 0; }
void *createInferRefitter_INTERNAL(void *e, void *l, int v) { (void)e; (void)l; (void)v; return 0; }
void *createInferRuntime_INTERNAL(void *l, int v) { (void)l; (void)v; return 0; }
int getInferLibVersion(void) { return 101300; }
void *getPluginRegistry(void) { return 0; }
EOF
cat > nvonnxparser.c <<'EOF'
void *createNvOnnxParser_INTERNAL(void *n, void *l, int v) { (void)n; (void)l; (void)v; return 0; }
void *createNvOnnxParserRefitter_INTERNAL(void *r, void *l, int v) { (void)r; (void)l; (void)v; return 0; }
EOF
gcc -shared -fPIC -o libcuda.so.1 cuda.c -Wl,-soname,libcuda.so.1
gcc -shared -fPIC -o libcudart_preload.so cudart_preload.c
gcc -shared -fPIC -o libnvinfer.so.10 nvinfer.c -Wl,-soname,libnvinfer.so.10
gcc -shared -fPIC -o libnvonnxparser.so.10 nvonnxparser.c -Wl,-soname,libnvonnxparser.so.10

# snapshot_ort_kernels.py imports only the standard library and onnxruntime: run it by path
# (graphopt itself is not installed in this venv).
LD_PRELOAD="$work/stubs/libcudart_preload.so" LD_LIBRARY_PATH="$work/stubs" "$work/venv/bin/python" - "$repo" "$out" <<'EOF'
import json, runpy, sys
import onnxruntime
from onnxruntime.capi import build_and_package_info as info

onnxruntime.preload_dlls(cuda=True, cudnn=True, msvc=False)  # the nvidia-* wheels' libraries
repo, out = sys.argv[1], sys.argv[2]
snapshot = runpy.run_path(f"{repo}/graphopt/ops/snapshot_ort_kernels.py")["snapshot"]
table = snapshot("CUDAExecutionProvider")
if not table["kernels"]:
    sys.exit("error: the CUDA provider's registry came back empty")
table["package"] = f"{info.package_name} {info.__version__} (CUDA {getattr(info, 'cuda_version', '?')})"
table["read_with"] = "benchmarks/snapshot_ort_cuda_kernels.sh (the wheel's registry, read without a GPU)"
with open(out, "w") as f:
    json.dump(table, f, indent=0, sort_keys=True)
    f.write("\n")
print(f"{out}: {len(table['kernels'])} ops of {table['package']}")
EOF
