// Per-row and elementwise kernels: rmsnorm, rope, swiglu, embedding, cross-entropy, AdamW.
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.hpp"

namespace sb::kernels {
using cpu::host_for;

// ---- rmsnorm ----
// x, y (N,C); w (C); rstd (N)
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int N, int C, double eps) {
  host_for("rmsnorm_fwd", N, [=](int64_t t) {
    const T* xt = x + t * C;
    double ss = 0;  // accumulate in double: C can be thousands
    for (int c = 0; c < C; c++) ss += double(xt[c]) * xt[c];
    T r = T(1.0 / std::sqrt(ss / C + eps));
    rstd[t] = r;
    for (int c = 0; c < C; c++) y[t * C + c] = xt[c] * r * w[c];
  });
}

// y = x*r*w with r = (mean(x^2)+eps)^-1/2:  dx = r*(dy*w) - x * r^3/C * sum(dy*w*x);  dw = sum_t dy*x*r
template <class T>
void rmsnorm_bwd(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int N, int C) {
  if (dx) {
    host_for("rmsnorm_bwd_dx", N, [=](int64_t t) {
      const T* xt = x + t * C;
      const T* dyt = dy + t * C;
      double dot = 0;
      for (int c = 0; c < C; c++) dot += double(dyt[c]) * w[c] * xt[c];
      double r = rstd[t];
      T k = T(dot * r * r * r / C);
      for (int c = 0; c < C; c++) dx[t * C + c] += T(r) * dyt[c] * w[c] - xt[c] * k;
    });
  }
  if (dw) {
    // Parallel over columns (not rows) so that dw accumulation does not race.
    host_for("rmsnorm_bwd_dw", C, [=](int64_t c) {
      double acc = 0;
      for (int64_t t = 0; t < N; t++) acc += double(dy[t * C + c]) * x[t * C + c] * rstd[t];
      dw[c] += T(acc);
    });
  }
}

// ---- rope (rotate-half) ----
std::vector<double> rope_plain_inv_freq(int D, double theta) {
  std::vector<double> f(size_t(D / 2));
  for (int d = 0; d < D / 2; d++) f[size_t(d)] = std::pow(theta, -2.0 * d / D);
  return f;
}

// x (N,nh,D) in place; sign = +1 rotates by +angle (forward), -1 by -angle (backward = inverse);
// both scaled by f.scale (the backward of y = s R x is dx = s R^T dy).
template <class T>
static void rope_apply(T* x, const int32_t* pos, int N, int nh, int D, RopeFreqs f, double sign, const char* name) {
  const int half = D / 2;
  host_for(name, N, [=](int64_t t) {
    std::vector<T> cs(half), sn(half);  // angles in double, then cast
    for (int d = 0; d < half; d++) {
      double ang = double(pos[t]) * f.inv_freq[d];
      cs[d] = T(f.scale * std::cos(ang));
      sn[d] = T(f.scale * sign * std::sin(ang));
    }
    for (int h = 0; h < nh; h++) {
      T* xh = x + (t * nh + h) * D;
      for (int d = 0; d < half; d++) {
        T a = xh[d], b = xh[d + half];
        xh[d] = a * cs[d] - b * sn[d];
        xh[d + half] = b * cs[d] + a * sn[d];
      }
    }
  });
}

template <class T>
void rope_fwd(T* x, const int32_t* pos, int N, int nh, int D, RopeFreqs f) {
  rope_apply(x, pos, N, nh, D, f, +1.0, "rope_fwd");
}
template <class T>
void rope_bwd(T* dx, const int32_t* pos, int N, int nh, int D, RopeFreqs f) {
  rope_apply(dx, pos, N, nh, D, f, -1.0, "rope_bwd");  // a scaled orthogonal map: grad = scale * inverse
}

// ---- swiglu ----
// gate, up, h (n)
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, size_t n) {
  host_for("swiglu_fwd", int64_t(n), [=](int64_t i) {
    T g = gate[i];
    T sig = T(1) / (T(1) + std::exp(-g));
    h[i] = g * sig * up[i];
  });
}
// silu'(g) = sig * (1 + g*(1-sig))
template <class T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, T* dgate, T* dup, size_t n) {
  host_for("swiglu_bwd", int64_t(n), [=](int64_t i) {
    T g = gate[i];
    T sig = T(1) / (T(1) + std::exp(-g));
    T d = dh[i];
    dgate[i] = d * up[i] * sig * (T(1) + g * (T(1) - sig));
    dup[i] = d * g * sig;
  });
}

// ---- embedding ----
// ids (N); table (V,C); out (N,C)
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* out, int N, int C) {
  host_for("embedding_fwd", N, [=](int64_t t) {
    const T* row = table + int64_t(ids[t]) * C;
    for (int c = 0; c < C; c++) out[t * C + c] = row[c];
  });
}
// dtable[ids[t]] += dout[t]. Repeated ids would race if parallel over tokens: split the columns
// into chunks instead, each chunk walks all tokens.
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dtable, int N, int C) {
  const int chunk = 64;
  host_for("embedding_bwd", cpu::num_blocks(C, chunk), [=](int64_t b) {
    int c0 = int(b) * chunk, c1 = std::min(C, c0 + chunk);
    for (int64_t t = 0; t < N; t++) {
      T* row = dtable + int64_t(ids[t]) * C;
      for (int c = c0; c < c1; c++) row[c] += dout[t * C + c];
    }
  });
}

// ---- cross-entropy ----
// logits, dlogits (N,V) (may alias); targets (N); correct (N) optional
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int N, int V, T scale,
                     uint8_t* correct) {
  double total = 0;
  Kokkos::parallel_reduce(
      "cross_entropy", cpu::HostPolicy(0, N),
      [=](int64_t t, double& acc) {
        const T* z = logits + t * V;
        int32_t y = targets[t];
        // Everything is read (max, argmax, lse) before dlogits overwrites the row.
        int amax = 0;
        for (int v = 1; v < V; v++)
          if (z[v] > z[amax]) amax = v;
        double m = z[amax], sum = 0;
        for (int v = 0; v < V; v++) sum += std::exp(double(z[v]) - m);
        double lse = m + std::log(sum);
        if (correct) correct[t] = (y >= 0 && amax == y) ? 1 : 0;
        if (y < 0) {
          if (dlogits)
            for (int v = 0; v < V; v++) dlogits[t * V + v] = T(0);
          return;
        }
        acc += lse - double(z[y]);
        if (dlogits) {
          for (int v = 0; v < V; v++) {
            double p = std::exp(double(z[v]) - lse);
            dlogits[t * V + v] = T(double(scale) * (p - (v == y ? 1.0 : 0.0)));
          }
        }
      },
      total);
  return total;
}

// ---- AdamW ----
// p, g, m, v (n); bias correction 1 - beta^step, decoupled weight decay.
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int64_t step) {
  const float bc1 = float(1.0 - std::pow(double(beta1), double(step)));
  const float bc2 = float(1.0 - std::pow(double(beta2), double(step)));
  host_for("adamw", int64_t(n), [=](int64_t i) {
    float mi = beta1 * m[i] + (1.0f - beta1) * g[i];
    float vi = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * p[i]);
  });
}

#define SB_INSTANTIATE(T)                                                                         \
  template void rmsnorm_fwd<T>(const T*, const T*, T*, T*, int, int, double);                     \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const T*, T*, T*, int, int);         \
  template void rope_fwd<T>(T*, const int32_t*, int, int, int, RopeFreqs);                        \
  template void rope_bwd<T>(T*, const int32_t*, int, int, int, RopeFreqs);                        \
  template void swiglu_fwd<T>(const T*, const T*, T*, size_t);                                    \
  template void swiglu_bwd<T>(const T*, const T*, const T*, T*, T*, size_t);                      \
  template void embedding_fwd<T>(const int32_t*, const T*, T*, int, int);                         \
  template void embedding_bwd<T>(const int32_t*, const T*, T*, int, int);                         \
  template double cross_entropy<T>(const T*, const int32_t*, T*, int, int, T, uint8_t*);
SB_INSTANTIATE(float)
SB_INSTANTIATE(double)
#undef SB_INSTANTIATE

}  // namespace sb::kernels
