"""Homomorphic-encryption inference with TenSEAL CKKS (CryptoNets-style; seed 000 §1 claims HE is > 1000× slower).

Roles (one process, two contexts, a serialization boundary between them):

* the **data owner** holds the secret key; it encrypts each sample as one CKKS vector, serializes it (these are
  the bytes that go on the wire), and decrypts the returned result;
* the **model owner** holds the weights in plaintext and only a *public* context (public, relinearization and
  Galois keys, no secret key, sent once: ``setup_bytes``); it deserializes the ciphertext, evaluates the lowered
  program (:mod:`modelward.cost.program`): ``v ← v·Wᵀ + b`` (vector–matrix product by TenSEAL's diagonal method)
  and ``v ← v²`` (ciphertext × ciphertext + relinearization), and serializes the result.

Parameters (128-bit security, HE standard / SEAL ``tc128``; SEAL refuses larger moduli): the multiplicative depth
``L`` is one level per affine op and per square; the coefficient modulus is ``[s+i, s×L, s+i]`` bits for scale
``2^s`` and ``i`` integer bits, and the ring degree ``N`` is the smallest power of two whose 128-bit bound holds
(8192: 218 bits, 16384: 438, 32768: 881) and whose ``N/2`` slots hold every matrix product's ``in + out`` values
(TenSEAL issue #504: larger products decrypt to wrong values).

TenSEAL bug guarded against (issue #462): adding a *plaintext* vector to a ciphertext breaks the replicated slot
layout that the next ``mm`` relies on, so ``(Enc(a) + b).mm(W)`` decrypts to wrong values (reproduced with
tenseal 0.3.18). The model owner therefore adds each bias as a vector it encrypts under the public key
(``bias = "encrypted"``, the default). ``bias = "plain"`` reproduces the bug; the agreement check then fails
loudly (the test suite checks that it does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.cost.program import Program
from modelward.cost.result import BackendResult
from modelward.errors import ConfigError

# SEAL's largest total coefficient-modulus bit count per ring degree at 128-bit classical security (tc128).
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}


class HEConfig(StrictModel):
    """``[cost.he]``: CKKS parameters (``poly_modulus_degree`` 0 = the smallest that is secure and deep enough)."""

    poly_modulus_degree: int = Field(0, ge=0)
    scale_bits: int = Field(0, ge=0, le=59)  # 0 = auto: the largest scale ≤ 2^40 that the chosen N allows
    int_bits: int = Field(20, ge=1, le=39)  # room for |result| < 2^(int_bits-1) in the first prime
    bias: Literal["encrypted", "plain"] = "encrypted"


def choose_params(program: Program, cfg: HEConfig) -> tuple[int, list[int]]:
    """Ring degree N and coefficient-modulus bit sizes for `program` at 128-bit security (module docstring).

    With ``scale_bits = 0`` N is the smallest ring that fits the depth at scale 2^30, and the scale is then raised
    to the most that ring's bound allows (at most 2^40, primes ≤ 60 bits): precision for free at the same speed.

    Returns:
        (N, [bits of each prime]).
    Raises:
        ConfigError: the depth does not fit even N = 32768, or a given N is too small / insecure.
    Example:
        >>> from modelward.cost.program import Program, Op
        >>> choose_params(Program(4, 2, [Op("affine", "a", np.ones((2, 4)), np.zeros(2))]), HEConfig())
        (8192, [60, 40, 60])
        >>> choose_params(Program(4, 2, [Op("affine", "a", np.ones((2, 4)), np.zeros(2))]), HEConfig(scale_bits=30))
        (8192, [50, 30, 50])
    """
    if cfg.scale_bits == 0:
        n, _ = choose_params(program, cfg.model_copy(update={"scale_bits": 30}))
        depth = program.depth
        best = min(40, 60 - cfg.int_bits, (MAX_BITS_128[n] - 2 * cfg.int_bits) // (depth + 2))
        return choose_params(program, cfg.model_copy(update={"scale_bits": max(20, best),
                                                             "poly_modulus_degree": n}))
    edge = cfg.scale_bits + cfg.int_bits
    if edge > 60:
        raise ConfigError(f"cost.he: scale_bits + int_bits = {edge} > 60 (SEAL primes are at most 60 bits)")
    bits = [edge] + [cfg.scale_bits] * program.depth + [edge]
    need_slots = max([op.shape[0] + op.shape[1] + 1 for op in program.ops if op.kind == "affine"] + [0])
    total = sum(bits)
    fits = [n for n, mx in MAX_BITS_128.items() if n >= 8192 and total <= mx and n // 2 >= need_slots]
    if cfg.poly_modulus_degree:
        n = cfg.poly_modulus_degree
        if n not in MAX_BITS_128:
            raise ConfigError(f"cost.he.poly_modulus_degree {n}: valid choices: {sorted(MAX_BITS_128)} (or 0 = auto)")
        if n not in fits:
            raise ConfigError(f"cost.he.poly_modulus_degree {n}: depth {program.depth} needs {total} modulus bits "
                              f"and {need_slots} slots; 128-bit security allows {MAX_BITS_128[n]} bits and N/2 = "
                              f"{n // 2} slots at N = {n}; use 0 (auto) or one of {fits or 'none'}")
        return n, bits
    if not fits:
        raise ConfigError(f"cost.he: the model's multiplicative depth {program.depth} needs {total} modulus bits; "
                          "even N = 32768 allows only 881 at 128-bit security. Use fewer layers or a smaller "
                          "cost.he.scale_bits (TenSEAL has no bootstrapping).")
    return fits[0], bits


def tenseal_available() -> str | None:
    """None if TenSEAL imports, else the reason."""
    try:
        import tenseal  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure makes the row unavailable
        return f"tenseal does not import ({type(e).__name__}: {e}); install the extra: pip install 'modelward[cost]'"
    return None


class CKKSInference:
    """Data owner and model owner of one CKKS inference (module docstring)."""

    def __init__(self, program: Program, cfg: HEConfig) -> None:
        import tenseal as ts

        self.ts, self.program, self.cfg = ts, program, cfg
        self.n, self.bits = choose_params(program, cfg)
        t0 = time.perf_counter()
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, self.n, coeff_mod_bit_sizes=self.bits)
        self.scale_bits = self.bits[1] if len(self.bits) > 2 else self.bits[0] - cfg.int_bits
        ctx.global_scale = 2.0**self.scale_bits
        ctx.generate_galois_keys()
        ctx.generate_relin_keys()
        self.secret_ctx = ctx
        public = ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=True,
                               save_relin_keys=True)
        self.setup_bytes = len(public)
        self.public_ctx = ts.context_from(public)  # the model owner's copy: no secret key
        if self.public_ctx.has_secret_key():
            raise RuntimeError("the model owner's context must not hold the secret key")
        self.weights = [(op.weight.T.copy(), op.bias.copy()) if op.kind == "affine" else None for op in program.ops]
        self.setup_s = time.perf_counter() - t0

    @property
    def params(self) -> str:
        return (f"CKKS N={self.n}, log q={sum(self.bits)} ({'/'.join(map(str, self.bits))}), scale 2^"
                f"{self.scale_bits}, 128-bit security (HE standard, SEAL tc128 ≤ {MAX_BITS_128[self.n]} bits), "
                f"depth {self.program.depth}, bias {self.cfg.bias}")

    # -- data owner
    def encrypt(self, x: np.ndarray) -> bytes:
        return self.ts.ckks_vector(self.secret_ctx, np.asarray(x, dtype=np.float64).reshape(-1).tolist()).serialize()

    def decrypt(self, blob: bytes) -> np.ndarray:
        return np.asarray(self.ts.ckks_vector_from(self.secret_ctx, blob).decrypt(), dtype=np.float64)

    # -- model owner
    def evaluate(self, blob: bytes) -> bytes:
        ts = self.ts
        v = ts.ckks_vector_from(self.public_ctx, blob)
        for op, wb in zip(self.program.ops, self.weights, strict=True):
            if op.kind == "square":
                v = v.square()
                continue
            w_t, b = wb  # type: ignore[misc]
            v = v.mm(w_t)
            if self.cfg.bias == "encrypted":
                v = v + ts.ckks_vector(self.public_ctx, b.tolist())  # keeps the replicated layout (#462)
            else:
                v = v + b.tolist()
        return v.serialize()

    def infer(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """One sample end to end; returns (outputs, bytes on the wire both ways)."""
        up = self.encrypt(x)
        down = self.evaluate(up)
        return self.decrypt(down), len(up) + len(down)


def run_he(program: Program, x: np.ndarray, cfg: HEConfig, progress: Callable[[], None] | None = None,
           engine: CKKSInference | None = None) -> BackendResult:
    """Measure CKKS inference of `program` on the samples `x` (n, features): per sample and for the batch.

    Returns:
        a :class:`BackendResult` with outputs for all n samples (the batch run), bytes per sample from the
        serialized ciphertexts and the one-time public-context bytes as ``setup_bytes``. `engine` reuses the keys
        of an existing :class:`CKKSInference` for the same program (tests).
    """
    res = BackendResult("he", batch_size=len(x), multiplications=program.multiplications())
    reason = tenseal_available()
    if reason:
        res.status, res.reason = "unavailable", reason
        return res
    he = engine or CKKSInference(program, cfg)
    res.params, res.setup_bytes, res.setup_s = he.params, float(he.setup_bytes), he.setup_s
    depth = program.depth
    tol_scale = 2.0 ** (18 + 2 * depth - he.scale_bits)
    res.precision = f"2^(18+2·depth-scale_bits) = 2^({18 + 2 * depth}-{he.scale_bits}) × (1 + max|plain|)"
    res.extra["tol_scale"] = tol_scale
    # Samples are independent ciphertexts, so one sample's end-to-end time inside the batch run *is* the
    # per-sample latency (median over the batch); no separate single-sample runs are needed.
    outs, nbytes, singles = [], 0, []
    t_enc = t_eval = 0.0
    t = time.perf_counter()
    for row in x:
        a = time.perf_counter()
        up = he.encrypt(row)
        b = time.perf_counter()
        down = he.evaluate(up)
        c = time.perf_counter()
        outs.append(he.decrypt(down)[: program.out_features])
        singles.append(time.perf_counter() - a)
        t_enc += b - a
        t_eval += c - b
        nbytes += len(up) + len(down)
        if progress is not None:
            progress()
    res.latency_batch_s = time.perf_counter() - t
    res.latency_sample_s = float(np.median(singles))
    res.bytes_per_sample = nbytes / len(x)
    res.outputs = np.stack(outs)
    res.extra.update(encrypt_s_per_sample=t_enc / len(x), model_owner_s_per_sample=t_eval / len(x),
                     slots=he.n // 2)
    return res


def tolerance(res: BackendResult, ref: np.ndarray) -> float:
    """The stated precision of CKKS with scale 2^s at multiplicative depth L: 2^(18+2L-s)·(1 + max|plain|).

    Empirical: the error is 2^-s times a factor that grows with every level (rescaling noise amplified by the
    weights and the x² activations). Measured factors: 2^18.7–2^20.5 at L = 3 (MLPs), 2^21.7–2^24.8 at L = 5 (the
    CNN), so the bound is 9–12× above the largest error seen."""
    return float(res.extra.get("tol_scale", math.inf)) * (1.0 + float(np.abs(ref).max()))
