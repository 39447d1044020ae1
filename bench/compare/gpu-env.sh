# Sourced by the GPU scripts on the device machine: the environment every run shares.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RAILCC_CACHE_DIR=${RAILCC_CACHE_DIR:-/tmp/railcc-cache}
OUT=${OUT:-/tmp/out}
R=.device/bin/railcc
NT=/tmp/nccl-tests   # nccl-tests builds here, outside the carried tree
[ -d $NT ] || cp -r .device/nccl-tests $NT
