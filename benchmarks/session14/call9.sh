# session 14, call 9: kfuse bench on the seeds at the committed code (the Hopper twin tuned in)
bash benchmarks/gpu_run.sh seeds $OUT
