# session 14, call 11: kfuse bench on the seeds with both Hopper twins (one tile per block, persistent) as tuning candidates
bash benchmarks/gpu_run.sh seeds $OUT
