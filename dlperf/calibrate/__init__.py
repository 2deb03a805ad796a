"""Calibration: time real kernels on this machine, fit the model's constants, write a hardware YAML.

- `calibration.calibrate()` times GEMM, convolution, memory and launch kernels (backend_numpy, backend_torch)
  in sweeps and fits Hockney curves (fit); a hook between sweeps is where --check times its steps.
- `comm.calibrate_comm()` times gloo allreduce/allgather/send-recv between 2 local processes (alpha-beta).
- `hwfile.write_hardware()` maps the fits onto the loader's curves and writes the YAML atomically.
- `check`: the real training steps (check_models/*.yaml, check_nets) timed between the sweeps
  (`StepRounds`; `data_parallel_rank()` for the 2-process MLP and its allreduce), and `run_check()`, which
  predicts them.
Nothing here is imported by `import dlperf`; torch and matplotlib are imported only where they are used.
"""
