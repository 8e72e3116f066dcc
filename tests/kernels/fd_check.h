// The finite-difference check of the float64 kernel tests: central differences of a scalar
// function against an analytic gradient, on up to ~1500 sampled elements.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace zrt::test {

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f with respect to x, compared with `analytic`.
inline void check_gradient(const std::string& what, std::vector<double>& x,
                           const std::vector<double>& analytic, const std::function<double()>& f) {
  REQUIRE(x.size() == analytic.size());
  const std::size_t stride = std::max<std::size_t>(1, x.size() / 1500);
  double diff2 = 0, ref2 = 0, max_abs = 0, max_ref = 0;
  for (std::size_t i = stride / 2; i < x.size(); i += stride) {
    const double saved = x[i];
    const double h = 1e-5 * std::max(1.0, std::abs(saved));
    x[i] = saved + h;
    const double fp = f();
    x[i] = saved - h;
    const double fm = f();
    x[i] = saved;
    const double numeric = (fp - fm) / (2 * h);
    const double d = numeric - analytic[i];
    diff2 += d * d;
    ref2 += numeric * numeric;
    max_abs = std::max(max_abs, std::abs(d));
    max_ref = std::max(max_ref, std::abs(numeric));
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  INFO(what << ": relative error " << rel << ", max abs error " << max_abs << " (max |grad| "
            << max_ref << ")");
  CHECK(ref2 > 0);
  CHECK(rel < 1e-7);
  CHECK(max_abs <= 1e-7 * std::max(1.0, max_ref));
}

}  // namespace zrt::test
