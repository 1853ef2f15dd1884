# The Hopper twins of other region kinds on the GPU, every GEMM forced onto one config (the tuner would pick them
# where faster): contract (2 draws + extra shape) and time_cuda at full size (gemm/sm90/twins-other-kinds/). BatchNorm
# eval (fold) 38, BatchNorm training + scale + softmax 25, the two-phase GroupNorm 08 and 43, two regions 35, a twin
# that spills 24. Ran at code 7a5f280 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
for p in 38 25 35 24; do timeout 150 python3 benchmarks/gemm/sm90_ab.py problems/gemm/${p}_*.py --configs triton,sm90_c4,sm90p_c4 --rounds 1 --json $OUT/ab-$p.json > $OUT/ab-$p.log 2>&1; cut -c1-330 $OUT/ab-$p.log; done
for p in 08 43; do timeout 120 python3 benchmarks/gemm/sm90_ab.py problems/gemm/${p}_*.py --configs triton,sm90_c4 --rounds 1 --json $OUT/ab-$p.json > $OUT/ab-$p.log 2>&1; cut -c1-330 $OUT/ab-$p.log; done
