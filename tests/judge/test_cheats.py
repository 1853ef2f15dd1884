"""Every planted cheat is caught by its detector; every honest control passes clean (CPU, interpreter)."""

from __future__ import annotations

import pytest

from kfuse.judge import cheats

# candidate -> (correct, the flags it must raise); controls must raise exactly these flags, cheats at least.
EXPECTED = {
    "honest": (True, set()),
    "honest_scale": (True, set()),
    "no_kernel": (True, {"no_custom_kernel"}),  # a finding, not a failure: plain torch is still right
    "cached": (False, {"cached_results"}),
    "inplace_input": (False, {"inputs_modified"}),
    "alias_input": (False, {"output_aliases_input"}),
    "monkeypatch_checks": (False, {"monkeypatch"}),
    "monkeypatch_timer": (False, {"monkeypatch"}),
    "precision_flags": (False, {"precision_flags"}),
    "global_mode": (False, {"global_mode"}),
    "reads_other_tensor": (False, {"process_introspection"}),
    "deferred_thread": (False, {"deferred_work"}),
    "lazy_output": (False, {"lazy_output"}),
    "unwritten": (False, {"unwritten_output"}),
    "specialized_batch": (False, {"shape_specialized"}),
    "specialized_features": (False, {"shape_specialized"}),
    "specialized_offsets": (False, {"shape_specialized"}),
    # plain torch that would raise "ESCAPED" had it predicted a draw: it cannot, so it is simply right
    "predicts_inputs": (True, {"no_custom_kernel"}),
    "honest_renamed_buffers": (True, {"no_custom_kernel", "state_dict_mismatch"}),
}
CONTROLS = ("honest", "honest_scale", "no_kernel", "predicts_inputs", "honest_renamed_buffers")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_planted_candidate(records, name):
    rec = records[name]
    correct, flags = EXPECTED[name]
    assert rec.compiled, rec.error
    assert rec.correct is correct, (rec.flag_details, rec.failures, rec.error)
    if name in CONTROLS:
        assert set(rec.flags) == flags, rec.flag_details
        assert rec.error is None and not rec.failures
    else:
        assert flags <= set(rec.flags), rec.flag_details
        assert set(rec.flags) & cheats.FAILING, "a cheat must raise at least one failing flag"


def test_controls_are_checked_at_every_shape(records):
    rec = records["honest"]
    assert rec.shapes[0] == "as given" and rec.shapes[1].startswith("batch_size=")
    assert rec.shapes[2].startswith("in_features=") and len(rec.shapes) == 3
    assert rec.trials == 5 and rec.rules["extra_shape"] is True
    assert rec.triton_launches >= rec.trials and rec.kernels == ["linear_relu_kernel"]
    assert rec.max_abs_err <= 2 * rec.ref_max_abs_err + 1e-7


def test_honest_timing_is_marked_unavailable_on_cpu(records):
    rec = records["honest"].to_json()
    assert rec["runtime_ms"] is None and rec["speedup_eager"] is None and rec["speedup_compile"] is None
    assert rec["timing"]["candidate"]["available"] is False


def test_monkeypatch_names_what_was_replaced(records):
    assert "torch.allclose" in records["monkeypatch_checks"].flag_details["monkeypatch"]
    timer = records["monkeypatch_timer"].flag_details["monkeypatch"]
    assert "torch.cuda.Event" in timer and "time.perf_counter" in timer
    # the timer cheat computes the right numbers: only the flag makes it incorrect
    assert all(records["monkeypatch_timer"].rules.values())


def test_precision_flags_found_at_import_and_in_forward(records):
    detail = records["precision_flags"].flag_details["precision_flags"]
    assert "allow_tf32" in detail and "'medium'" in detail


# Kernel names as the profiler records them (demangled): library kernels do not count as the candidate's own.
OWN_CUTLASS = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
               "kf_sm90::SplitMainloop, cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<"
               "KfSm90Epilogue<Epi_linear_mul_leaky_relu> >, void, void> >(cutlass::gemm::kernel::GemmUniversal<"
               "cute::tuple<int, int, int, int>, kf_sm90::SplitMainloop, void, void, void>::Params)")
STOCK_CUTLASS = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
                 "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<7, "
                 "cute::tuple<cute::C<2>, cute::C<1>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedCooperative"
                 ">, cutlass::half_t, cute::array<int, 4ul> >, void, void> >(cutlass::gemm::kernel::GemmUniversal<"
                 "void>::Params)")


@pytest.mark.parametrize("name,own", [
    (OWN_CUTLASS, True),  # CUTLASS's entry point around the candidate's own mainloop and epilogue
    (STOCK_CUTLASS, False),  # every type CUTLASS's or CuTe's: a stock GEMM, as torch's own CUTLASS kernels are
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x3_nt_align4>(cutlass_80_tensorop_s1688gemm_"
     "128x128_16x3_nt_align4::Params)", False),  # cuBLAS's CUTLASS kernels
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
     "5x_cublas", False),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >("
     "int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", False),
    ("void kf_split_rows_kernel<true>(float const*, long long, long long, int, int, __half*, float*)", True),
    ("triton_red_fused_sum_0", False),  # Inductor's
    ("fused_gemm_epilogue_kernel", True),  # a Triton kernel of the candidate's
])
def test_kernels_counted_as_the_candidates_own(name, own):
    custom, library = cheats.split_kernels([name])
    assert (custom, library) == (([name], []) if own else ([], [name]))
