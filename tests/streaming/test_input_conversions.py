"""Inputs people have are accepted when they are unambiguous, and refused with onlinefa's own message otherwise.

* bfloat16 snapshots (mixed-precision training) are converted exactly: every bfloat16 value is a float32
  value (the reference below builds it from the bits, independently of torch's conversion).
* A state ``dtype`` may be a name, a NumPy type or dtype object, or a torch dtype.
* A ``seed`` may be a NumPy ``Generator`` (one draw, which advances it) or a ``SeedSequence``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onlinefa
from engine_state import engine_state

torch = pytest.importorskip("torch")

D, K = 7, 2


def bfloat16_as_float32(x: Any) -> np.ndarray:
    """The float32 values of a bfloat16 tensor from its bits: a bfloat16 is the top 16 bits of a float32."""
    bits = x.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


def bfloat16_rows(n: int = 12, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return (3.0 * torch.randn(n, D, generator=g) + 1.0).bfloat16()


def state_of(model: Any) -> dict[str, Any]:
    return engine_state(model)


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


# --- bfloat16 / float16 snapshots ---------------------------------------------------------------------

def test_the_bit_reference_is_the_value() -> None:
    x = torch.tensor([1.0, -2.5, 0.1, 3.0e38, 1e-40], dtype=torch.bfloat16)
    np.testing.assert_array_equal(bfloat16_as_float32(x), x.float().numpy())


@pytest.mark.parametrize("make", [
    lambda: onlinefa.OnlineEM(D, K, n_warmup=3, seed=0),
    lambda: onlinefa.OnlineEM(D, K, n_warmup=3, seed=0, dtype="float32"),
    lambda: onlinefa.OnlineSGA(D, K, n_warmup=3, seed=0),
    lambda: onlinefa.MiniBatchEM(D, K, batch_size=4, seed=0),
], ids=["em", "em-float32", "sga", "minibatch"])
def test_bfloat16_batches_update_like_their_exact_float32_values(make: Any) -> None:
    rows = bfloat16_rows()
    model, reference = make(), make()
    model.update(rows)
    reference.update(bfloat16_as_float32(rows))
    assert_same_state(state_of(model), state_of(reference))
    np.testing.assert_array_equal(model.log_prob(rows[:3]), reference.log_prob(bfloat16_as_float32(rows[:3])))


def test_a_bfloat16_parameter_vector_feeds_a_model() -> None:
    """The snapshot of a network trained in bfloat16, gathered in its own precision."""
    from onlinefa.torch import ParameterVector

    net = torch.nn.Linear(3, 2).to(torch.bfloat16)
    vector = ParameterVector(net, dtype=torch.bfloat16)
    theta = vector.gather()
    assert theta.dtype == torch.bfloat16
    em, reference = onlinefa.OnlineEM(len(vector), 2, seed=0), onlinefa.OnlineEM(len(vector), 2, seed=0)
    em.update(theta)
    reference.update(bfloat16_as_float32(theta))
    assert_same_state(state_of(em), state_of(reference))


def test_swag_and_the_estimator_read_bfloat16() -> None:
    from onlinefa.torch import SWAG

    rows = bfloat16_rows(30)
    exact = bfloat16_as_float32(rows)
    swag, swag_ref = SWAG(D, max_rank=3), SWAG(D, max_rank=3)
    for row, row_ref in zip(rows, exact):
        swag.update(row)
        swag_ref.update(row_ref)
    np.testing.assert_array_equal(swag.mean, swag_ref.mean)
    np.testing.assert_array_equal(swag.loadings, swag_ref.loadings)
    fa = onlinefa.OnlineFactorAnalysis(K, n_warmup=3, random_state=0).partial_fit(rows)
    fa_ref = onlinefa.OnlineFactorAnalysis(K, n_warmup=3, random_state=0).partial_fit(exact)
    np.testing.assert_array_equal(fa.components_, fa_ref.components_)


def test_vifa_reads_bfloat16_gradients_and_initial_means() -> None:
    rows = bfloat16_rows(2)
    options = dict(prior_precision=1.0, lr_mean=0.01, lr_loadings=0.01, lr_log_noise=0.01, seed=0)
    vifa = onlinefa.VIFA(D, K, init_mean=rows[0], **options)
    ref = onlinefa.VIFA(D, K, init_mean=bfloat16_as_float32(rows[0]), **options)
    vifa.sample()
    ref.sample()
    vifa.step(rows[1])
    ref.step(bfloat16_as_float32(rows[1]))
    assert_same_state(state_of(vifa), state_of(ref))


def test_float16_tensors_are_read_exactly() -> None:
    rows = bfloat16_rows().half()
    em, ref = onlinefa.OnlineEM(D, K, n_warmup=3, seed=0), onlinefa.OnlineEM(D, K, n_warmup=3, seed=0)
    em.update(rows)
    ref.update(rows.numpy().astype(np.float64))
    assert_same_state(state_of(em), state_of(ref))


def test_a_bfloat16_tensor_requiring_grad_is_refused_with_our_message() -> None:
    em = onlinefa.OnlineEM(D, K, n_warmup=3, seed=0)
    before = state_of(em)
    with pytest.raises(TypeError, match="requires grad"):
        em.update(bfloat16_rows().requires_grad_())
    assert_same_state(state_of(em), before)


# --- dtype objects --------------------------------------------------------------------------------------

FLOAT32_SPELLINGS = ["float32", "f4", np.float32, np.dtype("float32"), torch.float32, torch.float]
FLOAT64_SPELLINGS = ["float64", np.float64, np.dtype("float64"), float, torch.float64, torch.double]


@pytest.mark.parametrize("make", [
    lambda dtype: onlinefa.OnlineEM(D, K, dtype=dtype),
    lambda dtype: onlinefa.OnlineSGA(D, K, dtype=dtype),
    lambda dtype: onlinefa.OnlineEM.algorithm2(D, K, dtype=dtype),
    lambda dtype: onlinefa.VIFA(D, K, prior_precision=1.0, lr_mean=0.1, lr_loadings=0.1, lr_log_noise=0.1,
                                dtype=dtype),
], ids=["em", "sga", "algorithm2", "vifa"])
def test_dtype_objects_select_the_state_dtype(make: Any) -> None:
    for dtype in FLOAT32_SPELLINGS:
        assert make(dtype).dtype == "float32", dtype
    for dtype in FLOAT64_SPELLINGS:
        assert make(dtype).dtype == "float64", dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, np.float16, "int64", "bfloat16",
                                   np.complex128, "float"])
def test_other_dtypes_are_refused_with_our_message(dtype: object) -> None:
    if dtype == "float":  # NumPy's name for float64: unambiguous, accepted
        assert onlinefa.OnlineEM(D, K, dtype=dtype).dtype == "float64"
        return
    with pytest.raises(ValueError, match="dtype must be .*float32.*float64"):
        onlinefa.OnlineEM(D, K, dtype=dtype)


def test_the_estimator_takes_a_torch_dtype() -> None:
    X = np.random.default_rng(0).standard_normal((60, D))
    fa = onlinefa.OnlineFactorAnalysis(K, n_warmup=3, random_state=0, dtype=torch.float32).fit(X)
    assert fa.components_.dtype == np.float32


# --- seeds ----------------------------------------------------------------------------------------------

def first_loadings(seed: object) -> np.ndarray:
    return onlinefa.OnlineEM(D, K, seed=seed).initial_parameters()[0]


def test_a_generator_seed_is_one_draw_from_it() -> None:
    expected = np.random.default_rng(0)
    first, second = int(expected.integers(0, 2**63 - 1)), int(expected.integers(0, 2**63 - 1))
    generator = np.random.default_rng(0)
    np.testing.assert_array_equal(first_loadings(generator), first_loadings(first))
    # The generator advanced: the next model gets the next draw, as scikit-learn's random_state users expect.
    np.testing.assert_array_equal(first_loadings(generator), first_loadings(second))
    assert not np.array_equal(first_loadings(first), first_loadings(second))
    # A fresh generator with the same seed is reproducible.
    np.testing.assert_array_equal(first_loadings(np.random.default_rng(0)), first_loadings(first))


def test_a_seed_sequence_is_its_first_64_bit_word() -> None:
    sequence = np.random.SeedSequence(1234)
    word = int(np.random.SeedSequence(1234).generate_state(1, dtype=np.uint64)[0])
    np.testing.assert_array_equal(first_loadings(sequence), first_loadings(word))
    np.testing.assert_array_equal(first_loadings(sequence), first_loadings(word))  # not consumed


def test_generator_seeds_reach_every_seeded_entry_point() -> None:
    from onlinefa.torch import sample_parameters

    X = np.random.default_rng(1).standard_normal((40, D))
    em = onlinefa.OnlineEM(D, K, n_warmup=3, seed=0).update(X)
    seed = int(np.random.default_rng(5).integers(0, 2**63 - 1))
    np.testing.assert_array_equal(em.sample(3, seed=np.random.default_rng(5)), em.sample(3, seed=seed))
    sga = onlinefa.OnlineSGA(D, K, seed=np.random.default_rng(5))
    np.testing.assert_array_equal(sga.initial_parameters()[0], onlinefa.OnlineSGA(D, K, seed=seed).initial_parameters()[0])
    mb = onlinefa.MiniBatchEM(D, K, seed=np.random.default_rng(5)).update(X)
    np.testing.assert_array_equal(mb.loadings, onlinefa.MiniBatchEM(D, K, seed=seed).update(X).loadings)
    options = dict(prior_precision=1.0, lr_mean=0.1, lr_loadings=0.1, lr_log_noise=0.1)
    np.testing.assert_array_equal(onlinefa.VIFA(D, K, seed=np.random.default_rng(5), **options).sample(),
                                  onlinefa.VIFA(D, K, seed=seed, **options).sample())
    drawn = torch.cat(list(sample_parameters(em, 4, seed=np.random.default_rng(5))))
    torch.testing.assert_close(drawn, torch.cat(list(sample_parameters(em, 4, seed=seed))), rtol=0, atol=0)


@pytest.mark.parametrize("seed", [np.random.RandomState(0), 1.5, np.float64(2.0), True, "3", [1, 2]],
                         ids=["RandomState", "float", "np.float64", "bool", "str", "list"])
def test_other_seeds_are_refused_with_our_message(seed: object) -> None:
    with pytest.raises(TypeError, match=r"seed must be None, an int in \[0, 2\*\*64\), a numpy.random.Generator"):
        onlinefa.OnlineEM(D, K, seed=seed)
    X = np.random.default_rng(1).standard_normal((20, D))
    em = onlinefa.OnlineEM(D, K, n_warmup=3, seed=0).update(X)
    with pytest.raises(TypeError, match="seed must be None"):
        em.sample(2, seed=seed)


def test_the_estimator_keeps_its_random_state_convention() -> None:
    """random_state=Generator gave one ``integers(0, 2**63 - 1)`` draw before check_seed took generators
    over; a RandomState still gives one ``randint(0, 2**31 - 1)`` draw."""
    X = np.random.default_rng(0).standard_normal((60, D))

    def components(random_state: object) -> np.ndarray:
        fa = onlinefa.OnlineFactorAnalysis(K, n_warmup=3, random_state=random_state).fit(X)
        return np.asarray(fa.components_)

    np.testing.assert_array_equal(components(np.random.default_rng(3)),
                                  components(int(np.random.default_rng(3).integers(0, 2**63 - 1))))
    np.testing.assert_array_equal(components(np.random.RandomState(3)),
                                  components(int(np.random.RandomState(3).randint(0, 2**31 - 1))))
    np.testing.assert_array_equal(components(np.random.SeedSequence(3)),
                                  components(int(np.random.SeedSequence(3).generate_state(1, dtype=np.uint64)[0])))
