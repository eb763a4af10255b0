"""Compare two train.py results (plain Python: also imported by the CPU tests, Python >= 3.6).

The checks of issue 4, for each model/optimizer run present in both results:

- first-step gradients: for every parameter array, max |g - g_ref| divided by the
  largest |g_ref| of the link it belongs to (``/conv/W`` and ``/conv/b`` share
  the scale of ``/conv``).  A bias right before BatchNormalization has an exact
  gradient of zero, only rounding noise: per-array relative errors mean nothing
  for it, so it is measured on its link's scale like every other array;
- every loss: |l - l_ref| / |l_ref|;
- the final outputs: max |o - o_ref| / max |o_ref| (reported).
"""


def _max_abs(values):
    return max(abs(v) for v in values) if values else 0.0


def _max_abs_diff(a, b):
    if len(a) != len(b):
        raise ValueError("arrays differ in size: %d vs %d" % (len(a), len(b)))
    return max(abs(x - y) for x, y in zip(a, b)) if a else 0.0


def _flatten(rows):
    out = []
    for row in rows:
        if isinstance(row, list):
            out.extend(_flatten(row))
        else:
            out.append(row)
    return out


def link_of(param_name):
    """'/conv/W' -> '/conv'."""
    return param_name.rsplit("/", 1)[0] or "/"


def grad_errors(grads, ref_grads):
    """{param: error relative to the largest reference gradient of its link}."""
    scale = {}
    for name, values in ref_grads.items():
        link = link_of(name)
        scale[link] = max(scale.get(link, 0.0), _max_abs(values))
    errors = {}
    for name, ref in ref_grads.items():
        if name not in grads:
            raise KeyError("gradient of %s is missing" % name)
        diff = _max_abs_diff(grads[name], ref)
        denominator = scale[link_of(name)]
        errors[name] = diff / denominator if denominator > 0 else diff
    return errors


def loss_errors(losses, ref_losses):
    if len(losses) != len(ref_losses):
        raise ValueError("%d losses vs %d" % (len(losses), len(ref_losses)))
    return [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(losses, ref_losses)]


def compare(result, reference, device, ref_device, loss_rtol, grad_tol=None):
    """Compare ``result``'s runs on ``device`` with ``reference``'s on ``ref_device``.

    Returns ``{"ok": bool, "problems": [...], "runs": {name: metrics}}``.  Gradients
    are checked only when ``grad_tol`` is given.
    """
    problems, runs = [], {}
    names = sorted(k.split("/", 1)[1] for k in result["runs"] if k.startswith(device + "/"))
    if not names:
        problems.append("no %s runs in the result" % device)
    for name in names:
        mine = result["runs"]["%s/%s" % (device, name)]
        ref = reference["runs"].get("%s/%s" % (ref_device, name))
        if ref is None:
            problems.append("%s: no %s reference run" % (name, ref_device))
            continue
        metrics = {}
        if abs(mine["init_checksum"] - ref["init_checksum"]) > 1e-6 * abs(ref["init_checksum"]):
            problems.append("%s: initial weights differ (%r vs %r)" % (name, mine["init_checksum"],
                                                                     ref["init_checksum"]))
        errors = loss_errors(mine["losses"], ref["losses"])
        worst = max(range(len(errors)), key=errors.__getitem__)
        metrics["loss_max_rel"] = errors[worst]
        metrics["loss_worst_iteration"] = worst
        if errors[worst] > loss_rtol:
            problems.append("%s: loss %d differs by %.3g relative (limit %g): %r vs %r" % (
                name, worst, errors[worst], loss_rtol, mine["losses"][worst], ref["losses"][worst]))
        if grad_tol is not None:
            gerr = grad_errors(mine["first_grads"], ref["first_grads"])
            metrics["grad_rel_to_link_max"] = gerr
            metrics["grad_max_rel"] = max(gerr.values())
            for param, err in sorted(gerr.items()):
                if err > grad_tol:
                    problems.append("%s: first-step gradient of %s differs by %.3g of its link's largest "
                                    "gradient (limit %g)" % (name, param, err, grad_tol))
        out, out_ref = _flatten(mine["outputs"]), _flatten(ref["outputs"])
        scale = _max_abs(out_ref)
        metrics["output_max_rel"] = _max_abs_diff(out, out_ref) / scale if scale else _max_abs_diff(out, out_ref)
        runs[name] = metrics
    return {"ok": not problems, "problems": problems, "runs": runs}


def worst(comparison, metric):
    values = [m[metric] for m in comparison["runs"].values() if metric in m]
    return max(values) if values else None
