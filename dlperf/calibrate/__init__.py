"""Calibration: time real kernels on this machine, fit the model's constants, write a hardware YAML.

- `calibration.calibrate()` times GEMM, convolution, memory and launch kernels (backend_numpy, backend_torch)
  and fits Hockney curves (fit); `calibrate_concurrent()` does it as one of 2 processes sharing the CPU.
- `comm.calibrate_comm()` times gloo allreduce/allgather/send-recv between 2 local processes (alpha-beta).
- `hwfile.write_hardware()` maps the fits onto the loader's curves and writes the YAML atomically.
- `check.run_check()` predicts and times real training steps (check_models/*.yaml, check_nets).
Nothing here is imported by `import dlperf`; torch and matplotlib are imported only where they are used.
"""
