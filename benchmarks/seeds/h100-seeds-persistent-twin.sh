# kfuse bench on the seeds with both Hopper twins (one tile per block, persistent) as tuning candidates
# (seeds/h100-seeds-persistent-twin.log). Ran at code cf83fea on an H100, OUT its output folder.
bash benchmarks/gpu_run.sh seeds $OUT
