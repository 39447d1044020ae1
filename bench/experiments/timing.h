// Host timing helpers shared by the stand-alone experiments (launch_cost.cu, vmm_attr_cost.cu).
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

static inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

static inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
