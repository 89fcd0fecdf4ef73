"""Which teacher layer stands behind each layer of a transformer student (students/families/transformer.py): the
layers it is initialised from (`init`) and the pairs its layer losses compare (`layer_map`)."""
from __future__ import annotations


INITS = ("skip", "first", "random")  # TransformerConfig.init, or the teacher layers themselves: [1, 5, 9, 12]


def teacher_layer_map(n_layer: int, teacher_layers: int, init) -> list[int]:
    """Teacher layer (1-based, as in `teacher_hidden_l{k}` / hidden_states[k]) behind each student layer: skip,
    first, random (the skip rule's layers, for the layer losses of a random student), or the chosen layers (a list,
    or "1,5,9,12"), one per student layer."""
    if not 1 <= n_layer <= teacher_layers:
        raise ValueError(f"a {n_layer}-layer student cannot take layers from a {teacher_layers}-layer teacher")
    if init not in INITS:
        return _chosen(init, n_layer, teacher_layers)
    if init == "first":
        return list(range(1, n_layer + 1))
    # "skip", and also the PKD targets of a randomly initialised student.
    m = teacher_layers // n_layer
    return [m * (j + 1) for j in range(n_layer)]


def _chosen(init, n_layer: int, teacher_layers: int) -> list[int]:
    """`init: [1, 5, 9, 12]` (or "1,5,9,12"): the student's layers from these teacher layers, in their order."""
    items = init.split(",") if isinstance(init, str) else init
    try:
        layers = [int(str(v).strip()) for v in items]
    except (TypeError, ValueError):
        raise ValueError(f"init must be one of {INITS} or the teacher layers to copy (e.g. [1, 5, 9, 12]), "
                         f"got {init!r}") from None
    if len(layers) != n_layer:
        raise ValueError(f"init {init!r} names {len(layers)} teacher layers for a {n_layer}-layer student: give "
                         f"n_layer: {len(layers)}, or one teacher layer per student layer")
    if any(not 1 <= t <= teacher_layers for t in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"init {init!r}: the teacher layers must be different, each between 1 and "
                         f"{teacher_layers} (its depth)")
    return layers


# StudentConfig.layer_map: which student layer the layer losses compare with which teacher layer.
LAYER_MAPS = ("uniform", "skip", "first", "last", "last-K", "a list of teacher layers, one per student layer",
              "student:teacher pairs")


def layer_pairs(spec, n_layer: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs, 1-based, for the layer losses.

    uniform (= skip, TinyBERT's g(m) = m·T/n): as `teacher_layer_map`; first: layer j ↔ j; last: the student's
    layers onto the teacher's top n; last-K: the student's top K layers onto the teacher's top K (MiniLM:
    last-1); "2,4,6" (or a list): teacher layer of each student layer; "3:6,4:12": explicit pairs.
    """
    if isinstance(spec, (list, tuple)):
        spec = ",".join(str(v) for v in spec)
    spec = str(spec).strip()
    if teacher_layers < 1:
        raise ValueError("the teacher's depth is unknown; the layer map needs it")
    if spec in ("uniform", "skip", "first"):
        chosen = teacher_layer_map(n_layer, teacher_layers, "first" if spec == "first" else "skip")
        return [(j + 1, t) for j, t in enumerate(chosen)]
    if spec == "last" or spec.startswith("last-"):
        k = n_layer if spec == "last" else _int(spec[5:], spec)
        if not 1 <= k <= min(n_layer, teacher_layers):
            raise ValueError(f"layer map {spec!r}: K must be between 1 and {min(n_layer, teacher_layers)} "
                             f"(a {n_layer}-layer student, a {teacher_layers}-layer teacher)")
        return [(n_layer - k + i, teacher_layers - k + i) for i in range(1, k + 1)]
    items = [p.strip() for p in spec.split(",") if p.strip()]
    if not items:
        raise ValueError(f"layer map {spec!r}: choose one of {', '.join(LAYER_MAPS)}")
    if all(":" in p for p in items):
        pairs = [(_int(a, spec), _int(b, spec)) for a, b in (p.split(":", 1) for p in items)]
    elif any(":" in p for p in items):
        raise ValueError(f"layer map {spec!r}: give either teacher layers or student:teacher pairs, not both")
    else:
        pairs = [(j + 1, _int(t, spec)) for j, t in enumerate(items)]
        if len(items) != n_layer:
            raise ValueError(f"layer map {spec!r}: {len(items)} teacher layers for a {n_layer}-layer student "
                             "(one per student layer, or student:teacher pairs)")
    bad = [(s, t) for s, t in pairs if not (1 <= s <= n_layer and 1 <= t <= teacher_layers)]
    if bad:
        raise ValueError(f"layer map {spec!r}: pairs {bad} out of range (student layers 1..{n_layer}, "
                         f"teacher layers 1..{teacher_layers})")
    students = [s for s, _ in pairs]
    if len(set(students)) != len(students):
        raise ValueError(f"layer map {spec!r}: a student layer appears twice")
    return sorted(pairs)


def _int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"layer map {spec!r}: {text!r} is not a layer number; choose one of "
                         f"{', '.join(LAYER_MAPS)}") from None
