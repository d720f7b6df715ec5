"""Pearson's chi-square goodness of fit, numpy and math only (no scipy here).

`target_probs` is the exact distribution a sampled engine must reproduce (a plain decode of
the target through the same transform). `gof(observed, expected_probs)` pools the cells whose expected count is under 5 (the usual
validity condition) into one, and returns (statistic, degrees of freedom). `pvalue` is the
chi-square upper tail: the regularised upper incomplete gamma Q(df/2, x/2), by its power
series below a + 1 and its continued fraction above (both converge fast there).
"""

from __future__ import annotations

import math

import numpy as np
from specgguf.decoding.promptcache import PromptCache

MIN_EXPECTED = 5.0


def gof(observed, probs) -> tuple[float, int]:
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    n = observed.sum()
    if n == 0:
        return 0.0, 0
    expected = n * probs / probs.sum()
    big = expected >= MIN_EXPECTED
    obs = list(observed[big])
    exp = list(expected[big])
    rest_o, rest_e = observed[~big].sum(), expected[~big].sum()
    if rest_e > 0:
        if rest_e >= MIN_EXPECTED or not exp:
            obs.append(rest_o)
            exp.append(rest_e)
        else:  # too small to stand alone: fold into the smallest big cell
            j = int(np.argmin(exp))
            obs[j] += rest_o
            exp[j] += rest_e
    elif rest_o > 0:  # a count where the model says probability 0: impossible under H0
        return math.inf, max(len(exp) - 1, 1)
    obs, exp = np.array(obs), np.array(exp)
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def pvalue(stat: float, df: int) -> float:
    if df <= 0:
        return 1.0
    if math.isinf(stat):
        return 0.0
    return _gamma_q(df / 2.0, stat / 2.0)


def _gamma_q(a: float, x: float) -> float:
    if x <= 0:
        return 1.0
    log_pre = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # P by series, Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    # Q by Lentz's continued fraction
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return h * math.exp(log_pre)


def target_probs(llm, prompt, prefix, sampling):
    """p(. | prompt + prefix) from a plain decode of the target, through the same transform;
    the mass of all end-of-generation tokens goes to one extra cell, the last."""
    from specgguf.decoding.sampling import Sampler

    ctx, batch, model = llm.target.ctx, llm.target.batch, llm.target.model
    ctx.clear()
    PromptCache.of(llm.target).forget()  # used directly: the prompt cache must not trust the context
    batch.clear().add_tokens(prompt + list(prefix), 0, "last")
    ctx.decode(batch)
    p = Sampler(sampling).probs(ctx.logits(len(prompt) + len(prefix) - 1))
    eog = np.array([model.is_eog(t) for t in range(p.size)])
    return np.append(np.where(eog, 0.0, p), p[eog].sum())
