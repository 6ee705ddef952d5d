"""jaxdist.compress.chunked against hand-computed cases: tiles, DCT-II, Top-k per tile, 2-bit."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist.compress import chunked as ck


@pytest.mark.parametrize(
  'shape, chunk, tile',
  [
    ((), 64, (1, 1)),
    ((100,), 64, (1, 50)),  # largest divisor of 100 that is <= 64
    ((67,), 64, (1, 1)),  # a prime longer than the chunk: tiles of one
    ((128, 96), 64, (64, 48)),
    ((64, 4, 16), 64, (64, 16)),  # 3-D: 256 x 16
    ((4, 16, 64), 64, (64, 64)),  # 3-D: 64 x 64
    ((65, 256), 64, (13, 64)),
  ],
)
def test_tile_shape_takes_the_largest_divisor_at_most_chunk(shape, chunk, tile):
  assert ck.tile_shape(shape, chunk) == tile


def test_to_tiles_cuts_a_matrix_row_major_over_the_tile_grid():
  x = jnp.arange(16.0).reshape(4, 4)
  want = [[[0, 1], [4, 5]], [[2, 3], [6, 7]], [[8, 9], [12, 13]], [[10, 11], [14, 15]]]
  np.testing.assert_array_equal(ck.to_tiles(x, 2), np.array(want, np.float32))
  np.testing.assert_array_equal(ck.from_tiles(ck.to_tiles(x, 2), (4, 4), 2), x)


@pytest.mark.parametrize('shape', [(), (7,), (6, 10), (2, 3, 8)])
def test_from_tiles_inverts_to_tiles(shape):
  x = jnp.arange(float(np.prod(shape, dtype=int))).reshape(shape)
  np.testing.assert_array_equal(ck.from_tiles(ck.to_tiles(x, 4), shape, 4), x)


def test_dct_is_the_orthonormal_dct_ii_of_a_4_vector():
  # X_k = sqrt(2/4)·c_k·Σ_i x_i·cos(π(2i+1)k/8), c_0 = 1/√2, for x = 1, 2, 3, 4:
  # X_0 = 10/2 = 5; X_1 = (1/√2)(−3cos(π/8) − cos(3π/8)) = −2.2304425;
  # X_2 = (1/√2)·cos(π/4)·(1 − 2 − 3 + 4) = 0; X_3 = (1/√2)(cos(π/8) − 3cos(3π/8)) = −0.1585127
  x = jnp.array([[[1.0, 2.0, 3.0, 4.0]]])  # one 1x4 tile
  np.testing.assert_allclose(
    ck.dct(x)[0, 0], [5.0, -2.2304425, 0.0, -0.1585127], rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(ck.idct(ck.dct(x)), x, rtol=1e-6)


def test_2d_dct_of_a_constant_tile_is_its_dc_term():
  x = jnp.full((1, 2, 4), 3.0)  # orthonormal: DC = 3·sqrt(8)
  want = np.zeros((2, 4), np.float32)
  want[0, 0] = 3.0 * np.sqrt(8.0)
  np.testing.assert_allclose(ck.dct(x)[0], want, atol=1e-6)


def test_topk_per_tile_keeps_the_largest_magnitudes_of_each_tile():
  tiles = jnp.array([[3.0, -5.0, 1.0, 0.0], [0.5, -0.1, 2.0, -4.0]])
  vals, idx = ck.topk_per_tile(tiles, 2)
  got = [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(idx, vals, strict=True)]
  assert got == [{1: -5.0, 0: 3.0}, {3: -4.0, 2: 2.0}]
  dense = ck.scatter_tiles(vals, idx, 4)
  np.testing.assert_array_equal(dense, [[3.0, -5.0, 0.0, 0.0], [0.0, 0.0, 2.0, -4.0]])


@pytest.mark.parametrize(
  'size, density, k', [(4096, 0.03125, 128), (64, 0.03125, 2), (10, 0.03125, 1), (4, 1.0, 4)]
)
def test_kept_per_tile_scales_with_the_tile(size, density, k):
  assert ck.kept_per_tile(size, density) == k


def test_quantize_2bit_by_hand():
  # mean 0; σ = sqrt(20/4) = √5; step = 6σ/4 = 3.354; c/step + 2 = 1.11, 1.70, 2, 2.30, 2.89
  # -> codes 1, 2, 2, 2, 3; lookup = [0 (empty), −3, mean(−1, 0, 1) = 0, 3]
  v = jnp.array([-3.0, -1.0, 0.0, 1.0, 3.0])
  codes, lookup, shift = ck.quantize(v, bits=2)
  np.testing.assert_array_equal(codes, [1, 2, 2, 2, 3])
  np.testing.assert_allclose(lookup, [0.0, -3.0, 0.0, 3.0], atol=1e-6)
  np.testing.assert_allclose(shift, 0.0, atol=1e-6)
  np.testing.assert_allclose(ck.dequantize(codes, lookup, shift), [-3, 0, 0, 0, 3], atol=1e-6)
  # shifted by 10: the same codes about the mean, decoded back with the shift
  codes, lookup, shift = ck.quantize(v + 10.0, bits=2)
  np.testing.assert_array_equal(codes, [1, 2, 2, 2, 3])
  np.testing.assert_allclose(ck.dequantize(codes, lookup, shift), [7, 10, 10, 10, 13], atol=1e-5)


def test_quantize_of_equal_values_or_one_value_is_exact():
  for v in (jnp.full((5,), 2.5), jnp.array([-1.25])):
    codes, lookup, shift = ck.quantize(v, bits=2)
    np.testing.assert_array_equal(codes, np.full(v.shape, 2))
    np.testing.assert_array_equal(ck.dequantize(codes, lookup, shift), v)


@pytest.mark.parametrize('size, nbytes', [(4096, 3 * 3), (64, 9), (65536, 10), (1 << 17, 20)])
def test_indices_pack_and_unpack(size, nbytes):
  idx = jnp.array([0, size - 1, 1, size // 2, 7])
  packed = ck.pack_indices(idx, size)
  assert packed.dtype == jnp.uint8 and packed.size == nbytes == ck.index_bytes(5, size)
  np.testing.assert_array_equal(ck.unpack_indices(packed, 5, size), idx)


def test_12bit_layout_by_hand():
  # a = 0xABC, b = 0x123 -> bytes 0xBC, 0xA | 0x3 << 4 = 0x3A, 0x12
  np.testing.assert_array_equal(
    ck.pack_indices(jnp.array([0xABC, 0x123]), 4096), [0xBC, 0x3A, 0x12]
  )


@pytest.mark.parametrize('shape', [(3, 64, 64), (2, 1, 16), (5, 8, 1), (1, 1, 1), (2, 48, 16)])
def test_dct_is_scipy_s_orthonormal_dct_ii_and_idct_inverts_it(shape):
  import jax.scipy.fft as jfft

  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  want = jfft.dctn(x, type=2, axes=(1, 2), norm='ortho')
  np.testing.assert_allclose(ck.dct(x), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ck.idct(ck.dct(x)), x, rtol=1e-5, atol=1e-5)
