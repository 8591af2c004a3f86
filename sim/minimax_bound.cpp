#include "sim/minimax_bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>

namespace pipetune {
namespace {

// max c.x subject to A x <= b (b >= 0), x >= 0, by the tableau simplex method with Bland's rule
// (no cycling). Returns x; the problem here is always feasible (x = 0) and bounded.
std::vector<double> maximise(const std::vector<std::vector<double>>& a,
                             const std::vector<double>& b, const std::vector<double>& c,
                             std::vector<double>* duals) {
  const std::size_t rows = a.size(), vars = c.size(), cols = vars + rows + 1;
  // Row r: the constraint with its slack; the last row: the reduced costs (-c).
  std::vector<std::vector<double>> t(rows + 1, std::vector<double>(cols, 0.0));
  std::vector<std::size_t> basis(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy(a[r].begin(), a[r].end(), t[r].begin());
    t[r][vars + r] = 1.0;
    t[r][cols - 1] = b[r];
    basis[r] = vars + r;
  }
  for (std::size_t v = 0; v < vars; ++v) t[rows][v] = -c[v];
  double scale = 1.0;
  for (const auto& row : t)
    for (double x : row) scale = std::max(scale, std::abs(x));
  const double eps = 1e-12 * scale;
  for (std::size_t iteration = 0; iteration < 50 * (rows + vars); ++iteration) {
    std::size_t enter = cols;
    for (std::size_t v = 0; v + 1 < cols; ++v) {
      if (t[rows][v] < -eps) {
        enter = v;  // Bland: the lowest index that improves
        break;
      }
    }
    if (enter == cols) break;
    std::size_t leave = rows;
    double ratio = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rows; ++r) {
      if (t[r][enter] <= eps) continue;
      const double q = t[r][cols - 1] / t[r][enter];
      if (q < ratio || (q == ratio && leave < rows && basis[r] < basis[leave])) {
        ratio = q;
        leave = r;
      }
    }
    if (leave == rows) break;  // unbounded: cannot happen here
    const double pivot = t[leave][enter];
    for (double& x : t[leave]) x /= pivot;
    for (std::size_t r = 0; r <= rows; ++r) {
      if (r == leave || t[r][enter] == 0.0) continue;
      const double f = t[r][enter];
      for (std::size_t k = 0; k < cols; ++k) t[r][k] -= f * t[leave][k];
    }
    basis[leave] = enter;
  }
  if (duals) {
    duals->assign(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r) (*duals)[r] = t[rows][vars + r];
  }
  std::vector<double> x(vars, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    if (basis[r] < vars) x[basis[r]] = t[r][cols - 1];
  return x;
}

}  // namespace

double min_max_share_bound(const std::vector<double>& constant,
                           const std::vector<std::vector<double>>& slope, double total,
                           std::vector<double>* shares) {
  const std::size_t n = constant.size();
  if (n == 0) return -std::numeric_limits<double>::infinity();
  const std::size_t coords = slope.front().size();
  // value_k(i): function i with the whole total on coordinate k.
  auto value = [&](std::size_t i, std::size_t k) { return constant[i] + total * slope[i][k]; };
  // The functions may be negative; shift them so that the dual's z >= 0 loses nothing.
  double shift = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < coords; ++k) shift = std::max(shift, -value(i, k));
  // Variables (z, w_1..w_n): max z with z <= sum_i w_i (value_k(i) + shift) for every k and
  // sum w <= 1.
  std::vector<std::vector<double>> a(coords + 1, std::vector<double>(n + 1, 0.0));
  std::vector<double> b(coords + 1, 0.0), c(n + 1, 0.0);
  c[0] = 1.0;
  for (std::size_t k = 0; k < coords; ++k) {
    a[k][0] = 1.0;
    for (std::size_t i = 0; i < n; ++i) a[k][i + 1] = -(value(i, k) + shift);
  }
  for (std::size_t i = 0; i < n; ++i) a[coords][i + 1] = 1.0;
  b[coords] = 1.0;
  std::vector<double> duals;
  const std::vector<double> x = maximise(a, b, c, shares ? &duals : nullptr);
  if (shares) {
    // The dual of each coordinate's constraint is the weight of that vertex: the share.
    shares->assign(coords, 0.0);
    double sum = 0.0;
    for (std::size_t k = 0; k < coords; ++k) sum += std::max(duals[k], 0.0);
    for (std::size_t k = 0; k < coords; ++k)
      (*shares)[k] = sum > 0.0 ? total * std::max(duals[k], 0.0) / sum : total / coords;
  }
  // The bound from the weights found, normalised (see the header).
  std::vector<double> w(x.begin() + 1, x.end());
  for (double& v : w) v = std::max(v, 0.0);
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  if (!(sum > 0.0)) {
    w.assign(n, 1.0 / static_cast<double>(n));
  } else {
    for (double& v : w) v /= sum;
  }
  double bound = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < coords; ++k) {
    double at_k = 0.0;
    for (std::size_t i = 0; i < n; ++i) at_k += w[i] * value(i, k);
    bound = std::min(bound, at_k);
  }
  return bound;
}

}  // namespace pipetune
