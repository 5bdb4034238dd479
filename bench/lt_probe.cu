// Probe of cuBLASLt's blockwise FP8 GEMM algorithms (bench/wgrad_lt.py): C [Mo, No] = A [Mo, K] B [No, K]^T
// with 1x128 scales on A and 1x128 (wgrad) or 128x128 (fprop, dgrad: the weight) on B, optionally
// accumulated into C (beta = 1).
// torch's scaled_mm asks cuBLASLt's heuristic for one algorithm; this lists what else it offers,
// with split-K variants, and times each, to see whether the wgrad GEMM has a faster kernel.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <vector>

namespace {
cublasLtHandle_t handle() {
  static cublasLtHandle_t h = nullptr;
  if (!h) cublasLtCreate(&h);
  return h;
}

struct Problem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  ~Problem() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

// column-major view: D (No x Mo, ld No) = op(A_cm) op(B_cm), A_cm = our B (K x No, transposed), B_cm = our A (K x Mo)
int make(Problem& p, const float* sA, const float* sB, int Mo, int No, int K, int b_block, int d_fp32) {
  cublasStatus_t st;
  if ((st = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return st;
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n));
  int8_t fast = 0;
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
  // cuBLAS's A is our B: its scales are sB; cuBLAS's B is our A
  int32_t mode_a = b_block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sB, sizeof(sB));
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sA, sizeof(sA));
  if ((st = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, No, K))) return st;
  if ((st = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, Mo, K))) return st;
  cudaDataType_t dt = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  if ((st = cublasLtMatrixLayoutCreate(&p.c, dt, No, Mo, No))) return st;
  if ((st = cublasLtMatrixLayoutCreate(&p.d, dt, No, Mo, No))) return st;
  return 0;
}

int32_t cfg(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;  // every attribute read here fits 32 bits; the 16-bit ones fill the low half
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &w);
  if (w == 2) v &= 0xFFFF;
  return (int32_t)v;
}
}  // namespace

// Lists the heuristic's algorithms (up to max_heur) plus split-K variants of each (2, 3, 4 splits,
// every reduction scheme the algorithm takes), times each over `reps` launches, and writes per
// candidate: ms, then 8 ints (algo id, tile, split-K, reduction, swizzle, stages, cluster,
// heuristic rank or -1-rank for a variant) and the workspace it needs. Returns the candidate count
// (at most max_out), or -cublasStatus on a set-up failure.
extern "C" int lt_probe(const void* A, const void* B, const float* sA, const float* sB, void* C, int Mo, int No,
                        int K, int b_block, int d_fp32, float beta, void* ws, size_t ws_bytes, void* stream,
                        int max_heur, int reps, int max_out, float* out_ms, int* out_cfg, size_t* out_ws) {
  Problem p;
  if (int st = make(p, sA, sB, Mo, No, K, b_block, d_fp32)) return -st;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  std::vector<cublasLtMatmulHeuristicResult_t> heur(max_heur);
  int got = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle(), p.op, p.a, p.b, p.c, p.d, pref, max_heur, heur.data(), &got);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st) return -(int)st;
  std::vector<std::pair<cublasLtMatmulAlgo_t, int>> cands;
  for (int i = 0; i < got; ++i) {
    if (heur[i].state) continue;
    cands.push_back({heur[i].algo, i});
    int32_t splits_cap = 0;
    uint32_t schemes = 0;
    size_t w = 0;
    cublasLtMatmulAlgoCapGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splits_cap, sizeof(splits_cap), &w);
    cublasLtMatmulAlgoCapGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes), &w);
    if (!splits_cap || cfg(heur[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
    for (int32_t s : {2, 3, 4})
      for (uint32_t r : {1u, 2u, 4u}) {
        if (!(schemes & r)) continue;
        cublasLtMatmulAlgo_t v = heur[i].algo;
        cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof(s));
        cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r, sizeof(r));
        cublasLtMatmulHeuristicResult_t chk;
        if (cublasLtMatmulAlgoCheck(handle(), p.op, p.a, p.b, p.c, p.d, &v, &chk) == CUBLAS_STATUS_SUCCESS &&
            chk.workspaceSize <= ws_bytes)
          cands.push_back({v, -1 - i});
      }
  }
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  float alpha = 1.f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  int n = 0;
  for (auto& cand : cands) {
    if (n >= max_out) break;
    const cublasLtMatmulAlgo_t algo = cand.first;
    const int rank = cand.second;
    cublasLtMatmulHeuristicResult_t chk;
    cublasLtMatmulAlgoCheck(handle(), p.op, p.a, p.b, p.c, p.d, &algo, &chk);
    auto run = [&]() {
      return cublasLtMatmul(handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.d, &algo, ws, ws_bytes, cs);
    };
    float ms = -1.f;
    if (run() == CUBLAS_STATUS_SUCCESS) {
      run();
      cudaEventRecord(e0, cs);
      for (int r = 0; r < reps; ++r) run();
      cudaEventRecord(e1, cs);
      cudaEventSynchronize(e1);
      cudaEventElapsedTime(&ms, e0, e1);
      ms /= reps;
    }
    out_ms[n] = ms;
    int* c = out_cfg + 8 * n;
    c[0] = cfg(algo, CUBLASLT_ALGO_CONFIG_ID);
    c[1] = cfg(algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
    c[2] = cfg(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    c[3] = cfg(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    c[4] = cfg(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
    c[5] = cfg(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID);
    c[6] = cfg(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
    c[7] = rank;
    out_ws[n] = chk.workspaceSize;
    ++n;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return n;
}

// One launch of the heuristic's algorithm number `rank` (or its split-K variant), for the
// driver's correctness check against torch's scaled_mm: returns a cublasStatus.
extern "C" int lt_run(const void* A, const void* B, const float* sA, const float* sB, void* C, int Mo, int No, int K,
                      int b_block, int d_fp32, float beta, void* ws, size_t ws_bytes, void* stream, int rank,
                      int splits, int scheme) {
  Problem p;
  if (int st = make(p, sA, sB, Mo, No, K, b_block, d_fp32)) return st;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  std::vector<cublasLtMatmulHeuristicResult_t> heur(rank + 1);
  int got = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle(), p.op, p.a, p.b, p.c, p.d, pref, rank + 1, heur.data(), &got);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st) return st;
  if (got <= rank) return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulAlgo_t algo = heur[rank].algo;
  if (splits > 1) {
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
    uint32_t r = scheme;
    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r, sizeof(r));
  }
  float alpha = 1.f;
  return cublasLtMatmul(handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.d, &algo, ws, ws_bytes,
                        static_cast<cudaStream_t>(stream));
}
