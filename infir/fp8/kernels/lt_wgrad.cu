// The FP8 wgrad GEMM, C = A B^T (+ C), A [Mo, K] and B [No, K] in E4M3 with 1x128 scales along K
// (the tokens), through cuBLASLt itself rather than torch's scaled_mm.
//
// Why: scaled_mm takes the first algorithm of cuBLASLt's heuristic and always writes a new tensor,
// which is then added to megatron's FP32 main_grad (one more write, two more reads). Here the GEMM
// accumulates into main_grad (beta = 1, bit for bit the sum scaled_mm + add_ gives) and the caller
// may pick, per shape, the fastest of the heuristic's algorithms. On an H100 (bench/wgrad_lt.py)
// that cut the wgrad GEMM + add by 7% summed over Qwen2.5 shapes, and by up to 40% at the small
// 1.5B projections, where the heuristic's first tile leaves SMs idle.
//
// Only algorithms without split-K and without workspace are offered: each adds its K-blocks into the
// FP32 accumulator in the same order, so all of them give the same bits (bench/wgrad_lt.py saw this
// for every algorithm at every shape), and a captured CUDA graph holds no workspace pointer. At the
// Qwen2.5 shapes the heuristic offered as many such algorithms as with 64 MiB of workspace.
//
// Layout: cuBLASLt is column-major, so our row-major C [Mo, No] is its D (No x Mo) = op(B) A with
// op = transpose: cuBLAS's A is our B and its B is our A. Scales are in the layout torch's scaled_mm
// takes: (rows, K/128) with the rows contiguous. A's rows may be strided (lda >= K): the columns of
// every rank's tokens in the sequence-parallel split wgrad are read in place, not copied out first.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <mutex>
#include <vector>

namespace {

constexpr int MAX_ALGOS = 16;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

cublasLtHandle_t g_handle = nullptr;
std::vector<Plan*> g_plans;  // indexed by plan id; plans live as long as the process
std::mutex g_mutex;

int make_plan(int Mo, int No, int K, int lda, int d_fp32, const void* stand_in, Plan& p) {
  cublasStatus_t st;
  if ((st = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return st;
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  const int8_t fast_accum = 0;  // blockwise scaling promotes every 128 along K itself
  const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode));
  // the heuristic refuses blockwise scale modes without scale pointers (CUBLAS_STATUS_INVALID_VALUE);
  // it reads none, so any device address stands in until each call sets the real ones
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof(stand_in));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof(stand_in));
  if ((st = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, No, K))) return st;
  if ((st = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, Mo, lda))) return st;
  if ((st = cublasLtMatrixLayoutCreate(&p.c, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, No, Mo, No))) return st;

  cublasLtMatmulPreference_t pref;
  if ((st = cublasLtMatmulPreferenceCreate(&pref))) return st;
  const uint64_t no_workspace = 0;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace,
                                       sizeof(no_workspace));
  cublasLtMatmulHeuristicResult_t heur[MAX_ALGOS];
  int got = 0;
  st = cublasLtMatmulAlgoGetHeuristic(g_handle, p.op, p.a, p.b, p.c, p.c, pref, MAX_ALGOS, heur, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st) return st;
  for (int i = 0; i < got; ++i) {
    if (heur[i].state != CUBLAS_STATUS_SUCCESS || heur[i].workspaceSize) continue;
    int32_t splits = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits),
                                         &written);
    if (splits == 1) p.algos.push_back(heur[i].algo);
  }
  return p.algos.empty() ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// A plan for one (Mo, No, K, A's row stride, output type): its descriptors and the heuristic's
// unsplit, workspace-free algorithms. stand_in: any device address (the heuristic reads no data).
// Returns the plan id (>= 0) or -cublasStatus_t.
extern "C" int infir_lt_wgrad_plan(int Mo, int No, int K, int lda, int d_fp32, const void* stand_in) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_handle && cublasLtCreate(&g_handle) != CUBLAS_STATUS_SUCCESS) return -(int)CUBLAS_STATUS_NOT_INITIALIZED;
  Plan* p = new Plan();
  if (int st = make_plan(Mo, No, K, lda, d_fp32, stand_in, *p)) {
    delete p;
    return -st;
  }
  g_plans.push_back(p);
  return (int)g_plans.size() - 1;
}

extern "C" int infir_lt_wgrad_algos(int plan) { return (int)g_plans[plan]->algos.size(); }

// C = A B^T + beta C with the plan's algorithm number `algo`. Returns a cublasStatus_t.
extern "C" int infir_lt_wgrad(int plan, int algo, const void* A, const void* B, const float* sA, const float* sB,
                              void* C, float beta, void* stream) {
  Plan& p = *g_plans[plan];
  // set per call, on a descriptor only this (backward) thread uses: cuBLAS's A is our B
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sB, sizeof(sB));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sA, sizeof(sA));
  const float alpha = 1.f;
  return cublasLtMatmul(g_handle, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algos[algo], nullptr, 0,
                        static_cast<cudaStream_t>(stream));
}
