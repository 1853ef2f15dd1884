# The three products laid out along K ("k3"), the lagged-partial (MODE 2) TMA configs: benchmarks/gemm/concat_k.py
# --set 2 (gemm/concat_k_set2.log; the script writes $OUT/concat_k.json, committed as gemm/concat_k_set2.json). Ran at
# code 9c7baff (the commit that added concat_k.py) on an H100, OUT its output folder, in the same device call as train/dz-tiles.sh.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 120 python3 benchmarks/gemm/concat_k.py --set 2 > $OUT/concat_k2.log 2>&1; tail -12 $OUT/concat_k2.log
