#!/usr/bin/env python3
"""asc::stats against independent implementations: scipy.stats and scikit-learn (Debian's python3-scipy and
python3-sklearn), through the `stats json` tool. Deterministic figures (means, quantiles, effect sizes, NMI, ARI,
silhouette, Calinski-Harabasz, exact permutation p-values) must agree to rounding; resampled ones (bootstrap
intervals, random-mode p-values) to within their Monte Carlo error, since the two draw different random numbers.

    /usr/bin/python3 tests/stats_check.py build/release/tools/stats      (ctest: stats_check; exit 77 without scipy /
                                                                          scikit-learn)
"""
import json
import math
import subprocess
import sys

try:
    import numpy as np
    import scipy.stats
    import sklearn.cluster
    import sklearn.metrics
except ImportError as e:  # the check needs both libraries; skip, do not fail, where they are missing
    print(f"stats_check: skipped: {e} (apt-get install python3-scipy python3-sklearn)")
    sys.exit(77)

failures = []


def ask(requests):
    """Sends a list of requests to `stats json` and returns its list of answers."""
    out = subprocess.run([sys.argv[1], "json"], input=json.dumps(requests), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"stats json failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout)


def close(name, ours, theirs, rel=1e-12, abs_tol=1e-12):
    ok = math.isclose(ours, theirs, rel_tol=rel, abs_tol=abs_tol)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: ours {ours!r}, reference {theirs!r}")
    if not ok:
        failures.append(name)


rng = np.random.default_rng(20261126)

# ---- summaries, quantiles, effect sizes: exact ------------------------------------------------------------------
samples = [rng.normal(0.8, 0.02, n) for n in (2, 3, 5, 8, 13)] + [rng.integers(0, 2, 40).astype(float)]
requests = []
for x in samples:
    requests += [{"op": "describe", "x": x.tolist()}]
answers = ask(requests)
for x, a in zip(samples, answers):
    n = len(x)
    close(f"describe n={n} mean", a["mean"], float(np.mean(x)))
    close(f"describe n={n} std", a["std"], float(np.std(x, ddof=1)))
    close(f"describe n={n} median", a["median"], float(np.median(x)))
    close(f"describe n={n} iqm", a["iqm"], float(scipy.stats.trim_mean(x, 0.25)))

ps = [1e-300, 1e-15, 1e-8, 0.001, 0.02425, 0.05, 0.2, 0.5, 0.8, 0.975, 0.999, 1 - 1e-12]
answers = ask([{"op": "normal_quantile", "p": p} for p in ps] + [{"op": "normal_cdf", "z": z} for z in (-8, -1.5, 0, 2)])
for p, a in zip(ps, answers):
    close(f"normal_quantile({p})", a, float(scipy.stats.norm.ppf(p)), rel=1e-12)
for z, a in zip((-8, -1.5, 0, 2), answers[len(ps):]):
    close(f"normal_cdf({z})", a, float(scipy.stats.norm.cdf(z)), rel=1e-12)

pairs = [(rng.normal(0.80, 0.02, na), rng.normal(0.79, 0.03, nb)) for na, nb in ((5, 5), (3, 7), (10, 4))]
pairs.append((rng.integers(0, 4, 9).astype(float), rng.integers(0, 4, 6).astype(float)))  # ties
answers = ask([{"op": op, "a": a.tolist(), "b": b.tolist()} for a, b in pairs for op in ("cohens_d", "cliffs_delta")])
for i, (a, b) in enumerate(pairs):
    na, nb = len(a), len(b)
    pooled = math.sqrt(((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2))
    close(f"cohens_d {na}/{nb}", answers[2 * i], float((np.mean(a) - np.mean(b)) / pooled))
    u = scipy.stats.mannwhitneyu(a, b, alternative="two-sided").statistic  # U of a, ties counted 1/2
    close(f"cliffs_delta {na}/{nb} (2U/(nm) - 1)", answers[2 * i + 1], float(2 * u / (na * nb) - 1))


# ---- Student's t and Welch's test: exact ------------------------------------------------------------------------
tcases = [(p, df) for df in (1, 2, 3.5, 8, 30, 1000) for p in (1e-9, 0.01, 0.2, 0.8, 0.975, 0.999)]
answers = ask([{"op": "student_t_quantile", "p": p, "df": df} for p, df in tcases]
              + [{"op": "student_t_cdf", "t": t, "df": df} for t, df in ((-30, 2), (-2.5, 3), (0.7, 10), (4, 1.5))])
for (p, df), a in zip(tcases, answers):
    # scipy's own inverse is good to about 1e-10 (its cdf at its ppf is off by that much); ours is checked twice:
    # close to scipy's ppf, and scipy's cdf at our quantile gives p back to rounding
    close(f"student_t_quantile({p}, {df})", a, float(scipy.stats.t.ppf(p, df)), rel=1e-8)
    close(f"scipy's t cdf at student_t_quantile({p}, {df})", float(scipy.stats.t.cdf(a, df)), p, rel=1e-12)
for (t, df), a in zip(((-30, 2), (-2.5, 3), (0.7, 10), (4, 1.5)), answers[len(tcases):]):
    close(f"student_t_cdf({t}, {df})", a, float(scipy.stats.t.cdf(t, df)), rel=1e-11)
answers = ask([{"op": "welch_t_test", "a": a.tolist(), "b": b.tolist()} for a, b in pairs])
for (a, b), ours in zip(pairs, answers):
    ref = scipy.stats.ttest_ind(a, b, equal_var=False)
    close(f"welch_t_test {len(a)}/{len(b)} t", ours["t"], float(ref.statistic), rel=1e-12)
    close(f"welch_t_test {len(a)}/{len(b)} p", ours["p"], float(ref.pvalue), rel=1e-9)

    # Welch's interval: difference -+ t_{0.975, df} se with scipy's Welch-Satterthwaite df (scipy 1.10 has no
    # confidence_interval() for ttest_ind); its MDE: (t_{0.975, df} + t_{0.8, df}) se
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    close(f"welch_t_test {len(a)}/{len(b)} df", ours["df"], float(df), rel=1e-12)
    half = float(scipy.stats.t.ppf(0.975, df)) * se
    close(f"welch_t_test {len(a)}/{len(b)} low", ours["low"], float(np.mean(a) - np.mean(b) - half), rel=1e-8)
    close(f"welch_t_test {len(a)}/{len(b)} high", ours["high"], float(np.mean(a) - np.mean(b) + half), rel=1e-8)
    close(f"welch MDE {len(a)}/{len(b)}", ours["mde"],
          float((scipy.stats.t.ppf(0.975, df) + scipy.stats.t.ppf(0.8, df)) * se), rel=1e-8)
    # the interval goes with the test: 0 outside it exactly when p < 0.05
    if (ours["low"] > 0 or ours["high"] < 0) != (ours["p"] < 0.05):
        failures.append(f"welch interval and p disagree {len(a)}/{len(b)}")

# The paired t-test over seeds (scipy.stats.ttest_rel, with its interval)
seed_pairs = [(rng.normal(0.80, 0.02, n), None) for n in (2, 5, 9)]
seed_pairs = [(a, a - rng.normal(0.01, 0.01, len(a))) for a, _ in seed_pairs]
answers = ask([{"op": "paired_t_test", "a": a.tolist(), "b": b.tolist()} for a, b in seed_pairs])
for (a, b), ours in zip(seed_pairs, answers):
    ref = scipy.stats.ttest_rel(a, b)
    ci = ref.confidence_interval()
    close(f"paired_t_test n={len(a)} t", ours["t"], float(ref.statistic), rel=1e-10)
    close(f"paired_t_test n={len(a)} p", ours["p"], float(ref.pvalue), rel=1e-9)
    close(f"paired_t_test n={len(a)} low", ours["low"], float(ci.low), rel=1e-8)
    close(f"paired_t_test n={len(a)} high", ours["high"], float(ci.high), rel=1e-8)

# The one-sided binomial test of "above the majority-class rate" (scipy.stats.binomtest, alternative="greater")
bcases = [(0, 10, 0.3), (3, 10, 0.3), (10, 10, 0.3), (600, 1000, 0.55), (560, 1000, 0.55), (1100, 2000, 0.5),
          (70, 123, 0.41), (1, 1, 0.999), (5, 7, 0.0), (5, 7, 1.0), (1304, 2000, 0.6)]
answers = ask([{"op": "binomial_test_greater", "k": k, "n": n, "p0": p0} for k, n, p0 in bcases])
for (k, n, p0), ours in zip(bcases, answers):
    close(f"binomial_test_greater({k}, {n}, {p0})", ours,
          float(scipy.stats.binomtest(k, n, p0, alternative="greater").pvalue), rel=1e-9, abs_tol=1e-15)


def holm_reference(p):
    """Holm (1979) written out independently: adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


hcases = [[0.01, 0.04, 0.03], [0.5], [0.001, 0.2, 0.04, 0.04, 0.9], rng.random(12).tolist(), [0.02, 0.02]]
for p, ours in zip(hcases, ask([{"op": "holm_adjust", "p": p} for p in hcases])):
    for i, (o, r) in enumerate(zip(ours, holm_reference(p))):
        close(f"holm_adjust m={len(p)} [{i}]", o, r, rel=1e-15)


# ---- approximate randomisation: exact mode equals scipy's exact permutation test --------------------------------
def mean_diff(x, y, axis=-1):
    return np.mean(x - y, axis=axis)


for n in (5, 9, 12):
    a = rng.integers(0, 2, n).astype(float)
    b = rng.integers(0, 2, n).astype(float)
    a[0], b[0] = 1.0, 0.0  # at least one disagreement
    ours = ask([{"op": "approximate_randomization", "a": a.tolist(), "b": b.tolist(), "resamples": 10000}])[0]
    ref = scipy.stats.permutation_test((a, b), mean_diff, permutation_type="samples", vectorized=True,
                                       n_resamples=10000, alternative="two-sided")
    close(f"approximate_randomization exact n={n} p", ours["p"], float(ref.pvalue), rel=1e-9)
    if not ours["exact"]:
        failures.append(f"approximate_randomization n={n} not exact")

# Random mode: the same test, different random numbers; p within 5 standard errors of scipy's.
a = (rng.random(400) < 0.62).astype(float)
b = np.where(rng.random(400) < 0.85, a, 1 - a)  # correlated, like two models on one test set
ours = ask([{"op": "approximate_randomization", "a": a.tolist(), "b": b.tolist(), "resamples": 20000, "seed": 3}])[0]
ref = scipy.stats.permutation_test((a, b), mean_diff, permutation_type="samples", vectorized=True, n_resamples=20000,
                                   alternative="two-sided", random_state=4)
se = math.sqrt(max(ref.pvalue * (1 - ref.pvalue), 1e-4) / 20000)
close("approximate_randomization random p (Monte Carlo)", ours["p"], float(ref.pvalue), rel=0, abs_tol=5 * 2 * se)

# ---- bootstrap intervals: percentile intervals as scipy.stats.bootstrap computes them, within Monte Carlo error ---
x = rng.normal(0.8, 0.02, 5)
ours = ask([{"op": "bootstrap_mean_ci", "x": x.tolist(), "resamples": 20000, "seed": 1}])[0]
ref = scipy.stats.bootstrap((x,), np.mean, method="percentile", n_resamples=20000, random_state=2).confidence_interval
width = ref.high - ref.low
close("bootstrap_mean_ci low (5 seeds)", ours["low"], float(ref.low), rel=0, abs_tol=0.03 * width)
close("bootstrap_mean_ci high (5 seeds)", ours["high"], float(ref.high), rel=0, abs_tol=0.03 * width)

a, b = rng.normal(0.80, 0.02, 5), rng.normal(0.78, 0.02, 5)
ours = ask([{"op": "bootstrap_difference_ci", "a": a.tolist(), "b": b.tolist(), "resamples": 20000}])[0]
ref = scipy.stats.bootstrap((a, b), lambda u, v, axis=-1: np.mean(u, axis=axis) - np.mean(v, axis=axis),
                            method="percentile", n_resamples=20000, random_state=2).confidence_interval
width = ref.high - ref.low
close("bootstrap_difference_ci low", ours["low"], float(ref.low), rel=0, abs_tol=0.03 * width)
close("bootstrap_difference_ci high", ours["high"], float(ref.high), rel=0, abs_tol=0.03 * width)

# Paired bootstrap over 2000 test examples: interval as scipy's paired bootstrap of the mean difference; p against
# an independent numpy version of the shifted-null p-value.
a = (rng.random(2000) < 0.55).astype(float)
b = np.where(rng.random(2000) < 0.90, a, 1 - a)  # a small difference: p is moderate, its Monte Carlo check tight
ours = ask([{"op": "paired_bootstrap", "a": a.tolist(), "b": b.tolist(), "resamples": 20000, "seed": 5}])[0]
ref = scipy.stats.bootstrap((a, b), mean_diff, paired=True, vectorized=True, method="percentile", n_resamples=20000,
                            random_state=6).confidence_interval
width = ref.high - ref.low
close("paired_bootstrap delta", ours["delta"], float(np.mean(a - b)))
close("paired_bootstrap low", ours["low"], float(ref.low), rel=0, abs_tol=0.03 * width)
close("paired_bootstrap high", ours["high"], float(ref.high), rel=0, abs_tol=0.03 * width)
d = a - b
idx = rng.integers(0, len(d), (20000, len(d)))
boot = d[idx].mean(axis=1)
p_ref = (1 + np.sum(np.abs(boot - d.mean()) >= abs(d.mean()) - 1e-12)) / 20001
se = math.sqrt(max(p_ref * (1 - p_ref), 1e-4) / 20000)
close("paired_bootstrap p (numpy, Monte Carlo)", ours["p"], float(p_ref), rel=0, abs_tol=5 * 2 * se)

# ---- clustering scores: scikit-learn, exact -----------------------------------------------------------------------
requests, refs = [], []
for n, ku, kv in ((20, 2, 3), (200, 4, 4), (500, 3, 7), (50, 1, 5)):
    truth = rng.integers(0, ku, n)
    pred = np.where(rng.random(n) < 0.6, truth, rng.integers(0, kv, n)) + 10  # related, relabelled
    requests += [{"op": "normalized_mutual_info", "truth": truth.tolist(), "pred": pred.tolist()},
                 {"op": "adjusted_rand_index", "truth": truth.tolist(), "pred": pred.tolist()}]
    refs += [(f"NMI n={n}", sklearn.metrics.normalized_mutual_info_score(truth, pred)),
             (f"ARI n={n}", sklearn.metrics.adjusted_rand_score(truth, pred))]
for n, d, k in ((30, 2, 3), (200, 16, 4), (64, 64, 2)):
    x = rng.normal(size=(n, d)) + np.repeat(rng.normal(0, 2, (k, d)), n // k + 1, axis=0)[:n]
    labels = np.repeat(np.arange(k), n // k + 1)[:n]
    labels = np.where(rng.random(n) < 0.2, rng.integers(0, k, n), labels)
    requests += [{"op": "silhouette_score", "x": x.tolist(), "labels": labels.tolist()},
                 {"op": "calinski_harabasz_score", "x": x.tolist(), "labels": labels.tolist()}]
    refs += [(f"silhouette n={n} d={d}", sklearn.metrics.silhouette_score(x, labels)),
             (f"Calinski-Harabasz n={n} d={d}", sklearn.metrics.calinski_harabasz_score(x, labels))]
for (name, ref), ours in zip(refs, ask(requests)):
    close(name, ours, float(ref), rel=1e-10, abs_tol=1e-12)

# ---- k-means: the same partition and inertia as scikit-learn where the optimum is clear; no worse where it is not --
centres = rng.normal(0, 6, (5, 8))
x = np.concatenate([c + rng.normal(0, 0.5, (40, 8)) for c in centres])
ours = ask([{"op": "kmeans", "x": x.tolist(), "k": 5, "seed": 1}])[0]
ref = sklearn.cluster.KMeans(n_clusters=5, n_init=10, random_state=0).fit(x)
close("kmeans blobs: ARI(ours, scikit-learn)", sklearn.metrics.adjusted_rand_score(ref.labels_, ours["labels"]), 1.0)
close("kmeans blobs: inertia", ours["inertia"], float(ref.inertia_), rel=1e-9)
x = rng.random((300, 4))
ours = ask([{"op": "kmeans", "x": x.tolist(), "k": 6, "seed": 1}])[0]
ref = sklearn.cluster.KMeans(n_clusters=6, n_init=10, random_state=0).fit(x)
ok = ours["inertia"] <= 1.02 * ref.inertia_
print(f"{'ok  ' if ok else 'FAIL'} kmeans uniform data: inertia {ours['inertia']:.6f} vs scikit-learn's "
      f"{ref.inertia_:.6f} (allowed 2 % above: both are local optima)")
if not ok:
    failures.append("kmeans uniform inertia")

if failures:
    print(f"stats_check: {len(failures)} failure(s): {', '.join(failures)}")
    sys.exit(1)
print("stats_check: asc::stats agrees with scipy and scikit-learn")
