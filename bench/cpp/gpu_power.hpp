// GPU power and SM clock while a benchmark runs, from NVML (the driver's libnvidia-ml.so.1, opened
// with dlopen: no toolkit header or link dependency, and a build where it is absent still runs).
// Why: at long contexts the attention kernels run at the H200's 700 W cap, where the SM clock drops
// by up to a fifth and depends on what ran just before (bench/results/2026-12-04-power-cap-mha-splits.md), so a time
// alone does not say whether a kernel is slower per clock or only hotter.
//   PowerSampler ps;  ps.start();  ...timed loop...;  PowerSample s = ps.stop();
// A thread samples the SM clock and its clock-event reasons every 5 ms; the energy counter gives
// the mean board power over the whole interval (it updates every few tens of ms: read it over
// intervals of a second or more).
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <thread>

struct PowerSample {
  bool ok = false;
  double watts = 0;      // mean board power over the interval (energy counter), W
  double sm_mhz = 0;     // mean of the SM clock samples
  double capped = 0;     // share of samples with a power-cap clock reason (software or hardware)
};

class PowerSampler {
 public:
  PowerSampler() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    auto sym = [&](const char* n) { return dlsym(lib_, n); };
    auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    energy_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
    ok_ = init && handle && energy_ && clock_ && init() == 0 && handle(0, &dev_) == 0;
  }
  ~PowerSampler() {
    if (running_) stop();
    if (lib_) dlclose(lib_);  // nvmlShutdown is not needed for a process that ends
  }
  PowerSampler(const PowerSampler&) = delete;
  PowerSampler& operator=(const PowerSampler&) = delete;
  bool ok() const { return ok_; }

  void start() {
    if (!ok_ || running_) return;
    running_ = true;
    stop_ = false;
    n_ = 0, mhz_sum_ = 0, capped_ = 0;
    energy_(dev_, &e0_);
    t0_ = std::chrono::steady_clock::now();
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        unsigned mhz = 0;
        unsigned long long r = 0;
        if (clock_(dev_, 1 /* NVML_CLOCK_SM */, &mhz) == 0) {
          mhz_sum_ += mhz;
          // 0x4 software power cap, 0x80 hardware power brake (nvml.h's clocks event reasons)
          if (reasons_ && reasons_(dev_, &r) == 0 && (r & 0x84ull)) capped_++;
          n_++;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }

  PowerSample stop() {
    PowerSample s;
    if (!ok_ || !running_) return s;
    stop_ = true;
    thread_.join();
    running_ = false;
    unsigned long long e1 = 0;
    energy_(dev_, &e1);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    s.ok = n_ > 0 && sec > 0;
    s.watts = sec > 0 ? double(e1 - e0_) * 1e-3 / sec : 0;  // the counter is in mJ
    s.sm_mhz = n_ ? mhz_sum_ / n_ : 0;
    s.capped = n_ ? double(capped_) / n_ : 0;
    return s;
  }

 private:
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  bool ok_ = false, running_ = false;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int n_ = 0, capped_ = 0;
  double mhz_sum_ = 0;
  unsigned long long e0_ = 0;
  std::chrono::steady_clock::time_point t0_;
};
