"""The C++ side of `--backend cuda`'s convolution kind (the C++ translation unit, after glue.CPP_HELPERS): a region's
bound function checks its launches (kfuse/cuda/conv_runtime.py) against x, the weight's parts and the output's shape,
turns each into the CUDA side's KfConvArgs (conv_source.CONV_COMMON) and packs x's records on the current stream
(kf_conv_pack; not for the direct tile, conv_direct_source.py, which reads x as it is)."""

from __future__ import annotations

from kfuse.cuda.conv_runtime import CONV_CHANNELS, LAUNCH_FIELDS  # CP's multiple (conv_channels), a launch's ints

# The C++ translation unit's helper (after glue.CPP_HELPERS): the checked arguments of one convolution, x's records
# packed on the current stream (kept alive with the arguments until the tile is launched on the same stream).
CONV_CPP = r"""
struct KfConvOperands {
  std::vector<KfConvArgs> launches;
  torch::Tensor records, x_scale, amax;
};

// launches: kfuse/cuda/conv_runtime.py's, LAUNCH_FIELDS ints each: ConvGeometry.args() (M, C_in, D, H, W, OD, OH, OW,
// C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW), then FD, FH, FW, RD, RH, RW, UD, UH, UW,
// col; w (C_out, 2 K2) and w_scale (C_out,): split_rows of the weight's rows, cp = CIN_G padded to KF_CONV_CHANNELS;
// out_shape: the region's outputs' shape (B, C_out, FD FH FW as 1, 2 or 3 dims). direct: the direct tile's operands
// (conv_direct_source.py): x itself, not packed, and w the (C_out, K2) float64 rows; no w_scale (an undefined
// tensor).
static KfConvOperands kf_conv_operands(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& w_scale,
                                       const std::vector<int64_t>& launches, int64_t cp,
                                       const std::vector<int64_t>& out_shape, bool direct = false) {
  constexpr size_t F = KF_LAUNCH_FIELDS;
  TORCH_CHECK(!launches.empty() && launches.size() % F == 0, "kfuse: a convolution's launches are ", F,
              " sizes each, got ", launches.size());
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() >= 3,
              "kfuse: a convolution's input must be a contiguous float32 CUDA tensor (N, C, ...)");
  const int64_t* geo = launches.data();
  const int64_t B = x.size(0), C = geo[1], S = geo[2] * geo[3] * geo[4], G = C / std::max<int64_t>(geo[9], 1);
  TORCH_CHECK(x.numel() == B * C * S, "kfuse: the convolution's input ", x.sizes(), " does not match its geometry");
  TORCH_CHECK(geo[9] > 0 && geo[9] * G == C && geo[10] * G == geo[8], "kfuse: ", C, " input and ", geo[8],
              " output channels are not ", G, " groups of ", geo[9], " and ", geo[10]);
  TORCH_CHECK(cp % KF_CONV_CHANNELS == 0 && cp >= geo[9], "kfuse: padded channels ", cp, " for ", geo[9], " a group");
  kf_expect(w, "the convolution's weight parts", direct ? torch::kFloat64 : torch::kFloat16, 2, x);
  if (!direct) kf_expect(w_scale, "the weight's row scales", torch::kFloat32, 1, x);
  const int64_t K2 = direct ? w.size(1) : w.size(1) / 2;
  TORCH_CHECK(w.size(0) == geo[8] && (direct || (w_scale.size(0) == geo[8] && w.size(1) % (2 * KF_PAD_K) == 0)),
              "kfuse: the convolution's weight parts ", w.sizes(), " do not match its geometry");
  const int64_t PF = geo[23] * geo[24] * geo[25];  // a sample's output plane: int pixel indices in the kernel
  int64_t out_numel = 1;
  for (int64_t d : out_shape) out_numel *= d;
  TORCH_CHECK(out_shape.size() >= 3 && out_shape[0] == B && out_shape[1] == geo[8] && out_numel == B * geo[8] * PF,
              "kfuse: the convolution's output shape does not match its geometry");
  TORCH_CHECK(B <= 65535 && geo[8] <= KF_INT_MAX && G * cp <= 65536 && B * S * 2 * G * cp <= ((int64_t)1 << 40) &&
              B * geo[8] * PF <= ((int64_t)1 << 40) && PF < KF_INT_MAX,
              "kfuse: convolution too large for the CUDA kernel");
  TORCH_CHECK(!direct || (G * ((geo[10] + 15) / 16) <= 65535 && 16 * K2 < KF_INT_MAX && S < KF_INT_MAX),
              "kfuse: too many groups, taps or input pixels for the direct tile");
  KfConvOperands o;
  if (!direct) {
    o.records = torch::empty({B * S, 2 * G * cp}, x.options().dtype(torch::kFloat16));
    o.x_scale = torch::empty({B}, x.options());
    o.amax = torch::empty({B}, x.options().dtype(torch::kInt32));
  }
  for (size_t l = 0; l < launches.size(); l += F) {
    const int64_t* v = geo + l;
    const int64_t taps = v[11] * v[12] * v[13];
    for (int i = 1; i < 11; ++i)
      TORCH_CHECK(v[i] == geo[i] || (i >= 5 && i <= 7), "kfuse: a convolution's launches disagree on its sizes");
    TORCH_CHECK(v[0] == B * v[5] * v[6] * v[7] && v[0] <= (int64_t)1 << 40 && v[23] == geo[23] && v[24] == geo[24] &&
                v[25] == geo[25] && v[32] >= 0 && v[32] % KF_CONV_CHANNELS == 0 && v[32] + taps * cp <= K2,
                "kfuse: a convolution's launch does not match its input or weight");
    for (int d = 0; d < 3; ++d)  // the last pixel lands inside the output, in every dim
      TORCH_CHECK(v[5 + d] > 0 && v[26 + d] >= 0 && v[29 + d] > 0 && v[26 + d] + v[29 + d] * (v[5 + d] - 1) < v[23 + d],
                  "kfuse: a convolution launch's pixels land outside its output");
    KfConvArgs g;
    g.M = v[0];
    g.N = (int)v[8];
    g.G = (int)G;
    g.COUT_G = (int)v[10];
    g.CIN_G = (int)v[9];
    g.CP = (int)cp;
    int* sizes[] = {&g.D, &g.H, &g.W, &g.OD, &g.OH, &g.OW, &g.KD, &g.KH, &g.KW, &g.SD, &g.SH, &g.SW, &g.PD, &g.PH,
                    &g.PW, &g.DD, &g.DH, &g.DW};
    for (int i = 0; i < 18; ++i) *sizes[i] = (int)v[i < 6 ? 2 + i : 5 + i];
    int* land[] = {&g.FD, &g.FH, &g.FW, &g.RD, &g.RH, &g.RW, &g.UD, &g.UH, &g.UW};
    for (int i = 0; i < 9; ++i) *land[i] = (int)v[23 + i];
    g.x = direct ? (const void*)x.data_ptr<float>() : o.records.data_ptr();
    g.x_scale = direct ? nullptr : o.x_scale.data_ptr<float>();
    if (direct)
      g.w = w.data_ptr<double>() + v[32];  // col elements into each row
    else
      g.w = w.data_ptr<at::Half>() + v[32];
    g.w_scale = direct ? nullptr : w_scale.data_ptr<float>();
    g.K2 = K2;
    g.K = taps * cp;
    o.launches.push_back(g);
  }
  if (!direct)
    kf_check(kf_conv_pack(x.data_ptr<float>(), B, C, S, geo[9], cp,
                          reinterpret_cast<unsigned*>(o.amax.data_ptr<int>()), o.records.data_ptr(),
                          o.x_scale.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()),
             "kf_conv_pack");
  return o;
}
""".replace("KF_CONV_CHANNELS", str(CONV_CHANNELS)).replace("KF_LAUNCH_FIELDS", str(LAUNCH_FIELDS))
