"""transformers' ``from_pretrained`` keywords, as :func:`weightplan.from_pretrained` takes them.

A user migrating from ``AutoModel.from_pretrained`` types transformers' words first. Those
with a meaning here do it; the others are an :class:`ArgumentError` that says what to do:

=================================  ==========================================================
keyword                            here
=================================  ==========================================================
``dtype``, ``revision``,           as in transformers (``from_pretrained``'s own arguments;
``cache_dir``, ``token``,          ``subfolder``: the checkpoint in a folder of the directory
``local_files_only``,              or repo; ``generation_config`` replaces the model's)
``subfolder``, ``variant``, ``attn_implementation``, ``experts_implementation``,
``output_loading_info``, ``generation_config``
``AutoModelFor*.from_pretrained``  ``model_class=AutoModelFor*`` (or a model class): the head
``torch_dtype``                    ``dtype``, with transformers' deprecation (a FutureWarning)
``dtype={sub-config: dtype}``      ``dtype[""]`` for every module, as transformers (deprecated)
``device_map``                     ``device=``: one device, or ``{module prefix: device}``;
                                   ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"`` /
                                   ``"sequential"``: placed by the plan under ``max_memory``,
                                   the rest on ``"disk"`` in ``offload_folder`` (a dict
                                   may name ``"disk"`` too)
``max_memory``, ``offload_folder`` as in transformers, with an automatic ``device_map``
``trust_remote_code``              accepted; remote code never runs: without ``True``, a
                                   ``model_type`` transformers has is built from its classes,
                                   ``auto_map`` ignored, as there; where transformers would
                                   import ``auto_map``'s code (``True``, or a ``model_type``
                                   it lacks) it is a ``ModelBuildError`` saying so
``use_safetensors``                ``True`` accepted; ``False`` refused: pickles are never read
``low_cpu_mem_usage``, ``_fast_init``, ignored, any value, as transformers 5 ignores them
``offload_state_dict``, ``mirror``,  (weightplan always loads with low memory use and never
``from_tf``, ``from_flax``,          stages the state dict; only safetensors are read)
``_commit_hash``, ``_from_auto``,
``_from_pipeline``
``tp_plan="auto"``                 ``tp="auto"``, with transformers' deprecation (a
                                   FutureWarning); a dict plan: ``tp=TensorParallel(plan=)``
``tp_size``, ``device_mesh``,      refused: ``tp="auto"`` or ``tp=TensorParallel(...)``
``distributed_config``
``offload_buffers``                refused (``False`` accepted): buffers stay on the
                                   execution device
``quantization_config``            refused: the checkpoint's config decides (FP8 is kept;
                                   ``dequantize=True`` or a dtype dequantizes it)
``config``, ``state_dict``,        refused, each naming weightplan's way (build the model and
``key_mapping``, …                 :func:`weightplan.load` it, ``mapping=``)
``ignore_mismatched_sizes``,       refused: a shape mismatch is never loaded, nothing is
``weights_only``, ``disable_mmap``, unpickled, tensors are read into place, the model is
``fusion_config``, ``tqdm_class``  the class config.json names, the progress bar is ours
(each refused one, at its default)  taken: transformers' defaults (``key_mapping=None``,
                                   ``config=None``, ``weights_only=True``) ask for nothing,
                                   so code that passes its arguments through loads
anything else                      a config override, as in transformers (``num_labels=3``,
                                   ``output_attentions=True``): set on the config before the
                                   model is built (``from_dict``'s ``return_unused_kwargs``:
                                   a dict for a sub-config updates it); one the config has no
                                   attribute for (transformers passes it to ``__init__``) is
                                   refused, and a misspelt keyword (``dtpye``) is told the one
                                   it is closest to
=================================  ==========================================================

:func:`weightplan.save` and ``explain_save`` take ``save_pretrained``'s words at the values
that ask for nothing (``SAVE_HARMLESS``: ``safe_serialization=True``, ``is_main_process=True``,
``push_to_hub=False``, ``save_original_format=True``, ``None`` for ``state_dict``, ``variant``,
``token``, ``save_peft_format=True``, ``distributed_checkpoint=False``, push_to_hub's
``commit_message`` / ``repo_id`` / ``private`` at ``None``, ``create_pr=False``;
``max_shard_size`` is save's own) and say the others in save's terms
(``SAVE_WORDS``: ``save_original_format=False`` is ``mapping=[]``, ...).
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from weightplan.errors import ArgumentError

AUTOMATIC = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's strategies
AVAILABLE_AUTOMATIC: tuple[str, ...] = AUTOMATIC  # all of them: see tensors/schedule/device_plan
OWN_MODEL = ("build the model yourself (with weightplan.init_empty(): model = Cls(config)) "
             "and load it: weightplan.load(model, path)")


@dataclass(frozen=True)
class Refusal:
    """A keyword transformers takes and weightplan doesn't (or only with ``harmless``
    values, which ask for what weightplan does anyway)."""

    advice: str
    harmless: tuple[Any, ...] = ()


UNSET = (None,)  # transformers' default for most of its keywords: asks for nothing

REFUSED = {
    "trust_remote_code": Refusal("remote code never runs: weightplan builds only the classes "
                                 "transformers has; for a model defined in a repo's .py files, "
                                 f"{OWN_MODEL}", (False, None, True)),
    "use_safetensors": Refusal("only safetensors are read (pickle checkpoints are never "
                               "unpickled); convert the checkpoint to safetensors", (True, None)),
    "tp_plan": Refusal("pass tp='auto' (the model's tp_plan; from_pretrained takes "
                       "tp_plan='auto' as it) or "
                       "tp=weightplan.TensorParallel(plan={module glob: style})", UNSET),
    "tp_size": Refusal("the size is the process group's (torchrun --nproc-per-node N); pass "
                       "tp='auto', or tp=weightplan.TensorParallel(mesh=...) for a sub-mesh",
                       UNSET),
    "distributed_config": Refusal("pass tp='auto', or tp=weightplan.TensorParallel("
                                  "experts='ep') for expert parallelism", UNSET),
    "device_mesh": Refusal("pass tp=weightplan.TensorParallel(mesh=device_mesh) (a 1-D mesh)",
                           UNSET),
    "offload_buffers": Refusal("buffers stay on the execution device (offload_buffers=False, "
                               "transformers' default): drop it", (False, None)),
    "quantization_config": Refusal("the checkpoint's config.json decides: its FP8 weights are "
                                   "kept (pass dequantize=True, or a dtype, for a floating "
                                   "model); to quantize on save, weightplan.save(model, dir, "
                                   "quantize='fp8')", UNSET),
    "config": Refusal(f"the model is built from the checkpoint's config.json; to use another "
                      f"config, {OWN_MODEL}", UNSET),
    "state_dict": Refusal("to load a dict of tensors, build the model and pass the dict: "
                          "weightplan.load(model, state_dict)", UNSET),
    "key_mapping": Refusal("pass mapping=[weightplan.WeightRenaming(source, target), ...] "
                           "(weightplan's transforms)", UNSET),
    "gguf_file": Refusal("only safetensors are read", UNSET),
    "ignore_mismatched_sizes": Refusal(
        "a tensor whose shape differs from the model's is never loaded: the plan lists it "
        "(plan.mismatched) and the load is refused before a byte is written; to start such a "
        "layer from the model's init (a new head), load the other tensors: "
        "weightplan.load(model, {key: tensor, ...})", (False, None)),
    "weights_only": Refusal("only safetensors are read: nothing is unpickled, so there is "
                            "nothing to restrict: drop it", (True, None)),
    "disable_mmap": Refusal("tensors are read straight into place (pread; a file is mapped "
                            "only a window at a time, under a read lease): drop it",
                            (True, None)),
    "fusion_config": Refusal("fusion patches are not applied: the model is the class "
                             f"config.json names; for a fused model, {OWN_MODEL}", UNSET),
    "tqdm_class": Refusal("the progress bar is weightplan's own: progress=True or False",
                          UNSET),
    "allow_all_kernels": Refusal("hub kernels are not loaded: drop it", (False, None)),
    "kernels_mode": Refusal("hub kernels are not loaded: drop it", UNSET),
    "adapter_kwargs": Refusal("pass the adapter directory: adapter=ADAPTER_DIR (and "
                              "adapter_name=); its hub options are not taken", (None, {})),
    "use_kernels": Refusal("hub kernels are not loaded: drop it", (False, None)),
    "kernel_config": Refusal("hub kernels are not loaded: drop it", UNSET),
    "force_download": Refusal("the cached snapshot is used; to fetch it again, delete it "
                              "(hf cache delete) first", (False, None)),
    "proxies": Refusal("set HTTPS_PROXY in the environment instead", UNSET),
    "resume_download": Refusal("drop it (downloads always resume)", (None, True)),
}


# transformers 5 pops these from ``from_pretrained``'s keywords without reading them (no
# warning): any value asks for nothing there, and here (weightplan loads with low memory use,
# never initializes what it loads, reads safetensors only, never stages the state dict)
# (and its private words, which its auto classes and pipeline() pass: ``_commit_hash``,
# read by nothing in 5.x, ``_from_auto`` / ``_from_pipeline``, the Hub request's user agent)
IGNORED = ("low_cpu_mem_usage", "_fast_init", "offload_state_dict", "mirror", "from_tf",
           "from_flax", "_commit_hash", "_from_auto", "_from_pipeline")


RENAMED = {  # transformers' word → weightplan's, for the functions that don't take it
    "torch_dtype": "the dtype is dtype= (transformers' torch_dtype is deprecated there too)",
    "adapter": "the adapter directory is the checkpoint here: explain(model, ADAPTER_DIR, "
               "adapter_name=...); or weightplan.from_pretrained(BASE, adapter=ADAPTER_DIR)",
    "adapter_path": "pass the adapter directory as the checkpoint (explain/load), or "
                    "weightplan.from_pretrained(BASE, adapter=ADAPTER_DIR)",
}


SAVE_WORDS = {  # transformers' save_pretrained keywords → what weightplan.save does
    "state_dict": "save writes the model's own tensors: load the dict into the model first, "
                  "then save it",
    "variant": "variant files are not written: the files take transformers' names with "
               "no variant (model.safetensors, or model-0000i-of-0000N.safetensors and "
               "model.safetensors.index.json, whose weight_map names them); save the "
               "variant into a directory of its own",
    "safe_serialization": "weightplan writes only safetensors (safe_serialization=True, or "
                          "drop it)",
    "push_to_hub": "not done: save writes a directory and never uploads it; upload it "
                   "afterwards (hf upload ORG/NAME DIR)",
    "is_main_process": "the ranks that save together are process_group= (its first rank "
                       "writes); or call save on the main process only (if "
                       "is_main_process: weightplan.save(model, dir))",
    "save_original_format": "the checkpoint's original layout is what save writes; for the "
                            "model's own names (save_original_format=False), pass mapping=[]",
    "save_function": "the files are written by weightplan (in one commit): drop it",
    "token": "save writes a directory and never talks to the Hub: drop it",
    "save_peft_format": "an adapter (adapter_name=) is written in peft's format, its keys "
                        "under base_model.model. (save_peft_format=True, or drop it)",
    "distributed_checkpoint": "save writes one safetensors checkpoint; a tensor-parallel "
                              "model is gathered by the ranks of process_group= (for a DCP "
                              "checkpoint, call torch.distributed.checkpoint.save)",
    **dict.fromkeys(("commit_message", "repo_id", "create_pr", "private"),
                    "an option of push_to_hub, which save doesn't do: it writes a directory "
                    "and never uploads it; upload it afterwards (hf upload ORG/NAME DIR "
                    "--commit-message ...)"),
}
# save_pretrained's keywords at the values that ask for what save does anyway (its
# defaults, and safe_serialization=True): taken and dropped, as from_pretrained takes
# transformers' harmless ones, so code that passes its arguments through saves
SAVE_HARMLESS: dict[str, tuple[Any, ...]] = {
    "safe_serialization": (True,), "is_main_process": (True,), "push_to_hub": (False,),
    "save_original_format": (True,), "state_dict": UNSET, "variant": UNSET, "token": UNSET,
    "save_peft_format": (True,), "distributed_checkpoint": (False,),
    "commit_message": UNSET, "repo_id": UNSET, "create_pr": (False,), "private": UNSET}
SAVES = ("save", "explain_save")  # the functions SAVE_WORDS speaks for


def harmless(value: Any, values: Iterable[Any]) -> bool:
    """Whether ``value`` is one of ``values`` (by identity, or equal and of the same type:
    ``1`` is not ``True``)."""
    return any(value is h or (type(value) is type(h) and value == h) for h in values)


def drop_harmless_save_words(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the ``save_pretrained`` keywords whose value asks for nothing
    (:data:`SAVE_HARMLESS`); the others stay, to be refused with :data:`SAVE_WORDS`."""
    return {k: v for k, v in kwargs.items()
            if not (k in SAVE_HARMLESS and harmless(v, SAVE_HARMLESS[k]))}


def keyword_advice(keyword: str, function: str = "from_pretrained") -> str | None:
    """What to pass to ``function`` instead of transformers' ``keyword``, where weightplan
    names it differently or refuses it (a save: instead of ``save_pretrained``'s);
    ``None`` for a word transformers doesn't use there."""
    if function in SAVES:
        return SAVE_WORDS.get(keyword)
    if keyword in RENAMED:
        return RENAMED[keyword]
    if keyword in IGNORED:
        return "transformers 5 ignores it, and so does weightplan.from_pretrained: drop it"
    refusal = REFUSED.get(keyword)
    return None if refusal is None else refusal.advice


@dataclass(frozen=True)
class Folded:
    """transformers' keywords in weightplan's terms (:func:`fold_transformers_keywords`)."""

    dtype: Any  # after torch_dtype; None is "auto"
    tp: Any  # after tp_plan="auto"
    overrides: Mapping[str, Any]  # the others: config overrides, applied as transformers does

    def __iter__(self) -> Iterator[Any]:  # (dtype, tp, overrides = fold_...(...))
        return iter((self.dtype, self.tp, self.overrides))


def fold_transformers_keywords(extra: Mapping[str, Any], dtype: Any,
                               own: Iterable[str] = (), tp: Any = None) -> Folded:
    """The ``dtype`` to use after ``torch_dtype`` (``None`` for both is ``"auto"``, as in
    transformers 5), ``tp`` after ``tp_plan="auto"``, and the config overrides: the keywords
    in ``extra`` (what ``from_pretrained`` got beyond its own arguments, ``own``) transformers
    has no other use for, which it sets on the config (see ``bridge.hub``: one the config
    lacks is refused there). Refuses every refused keyword that isn't harmless; a misspelt
    one (close to one of ``own``) is told the keyword it is closest to.

    Raises:
        ArgumentError: a refused keyword or value (the message says what to do instead),
            ``torch_dtype`` and ``dtype`` (or ``tp_plan`` and ``tp``) both given and different.
    """
    extra = dict(extra)
    if "torch_dtype" in extra:
        torch_dtype = extra.pop("torch_dtype")
        warnings.warn("from_pretrained(torch_dtype=...) is deprecated, as in transformers: "
                      "use dtype=", FutureWarning, stacklevel=5)
        if dtype not in (None, "auto") and torch_dtype is not None and torch_dtype != dtype:
            raise ArgumentError(f"from_pretrained got dtype={dtype!r} and torch_dtype="
                                f"{torch_dtype!r}: pass dtype= only")
        if torch_dtype is not None and dtype in (None, "auto"):
            dtype = torch_dtype
    if isinstance(dtype, Mapping):
        dtype = _one_dtype(dtype)
    tp, overrides = _tp_plan(extra.pop("tp_plan", None), tp), {}
    for name, value in extra.items():
        if name in IGNORED:
            continue
        refusal = REFUSED.get(name)
        if refusal is None:
            overrides[name] = _override(name, value, own)
        elif not harmless(value, refusal.harmless):
            raise ArgumentError(f"from_pretrained({name}={shown(value)}): {refusal.advice}")
    return Folded("auto" if dtype is None else dtype, tp, overrides)


def _tp_plan(tp_plan: Any, tp: Any) -> Any:
    """``tp`` after transformers' ``tp_plan="auto"`` (deprecated there, still taken by 5.x:
    the model's own plan, which ``tp="auto"`` is here), with its FutureWarning.

    Raises:
        ArgumentError: a ``tp_plan`` other than ``"auto"`` (a dict), or ``tp=`` also given.
    """
    if tp_plan is None:
        return tp
    if not (isinstance(tp_plan, str) and tp_plan == "auto"):
        raise ArgumentError(f"from_pretrained(tp_plan={shown(tp_plan)}): "
                            f"{REFUSED['tp_plan'].advice}")
    if tp is not None and not (isinstance(tp, str) and tp == "auto"):
        raise ArgumentError(f"from_pretrained got tp_plan='auto' and tp={shown(tp)}: pass "
                            "tp= only")
    warnings.warn("from_pretrained(tp_plan='auto') is deprecated in transformers (5.x warns "
                  "too): use tp='auto'", FutureWarning, stacklevel=6)
    return "auto"


def _one_dtype(per_config: Mapping[Any, Any]) -> Any:
    """A dtype per sub-config, as transformers 5 takes it (deprecated there): every module
    in ``per_config[""]``, else torch's default dtype, with a warning."""
    import torch

    main = per_config.get("", torch.get_default_dtype())
    warnings.warn(f"from_pretrained(dtype={shown(dict(per_config))}): a dtype per sub-config "
                  "is deprecated in transformers, which loads every module in dtype[''] (else "
                  f"the default dtype); so does weightplan: {main}", FutureWarning, stacklevel=6)
    return main


SHOWN_AT_MOST = 60  # characters of a value's repr in a message


def shown(value: Any) -> str:
    """``value`` as a message names it: its repr when that is one short line, else its
    type (``LlamaConfig(...)``: a config's repr is its whole JSON)."""
    text = repr(value)
    if "\n" in text or len(text) > SHOWN_AT_MOST:
        return f"{type(value).__name__}(...)"
    return text


def did_you_mean(word: str, words: Iterable[str]) -> str | None:
    """The keyword ``word`` most likely misspells (``dtpye`` → ``dtype``), if one is close:
    the one test of every "did you mean" a keyword gets (``from_pretrained``'s and a
    guarded call's), so that a word is a misspelling everywhere or nowhere."""
    close = difflib.get_close_matches(word, list(words), n=1, cutoff=0.8)
    return close[0] if close else None


def _override(name: str, value: Any, own: Iterable[str]) -> Any:
    """``value``, a config override (``num_labels=3``), unless ``name`` misspells a keyword
    (``dtpye``): checked before any work, as a config can't be told from a typo before it
    is read (one the config lacks is refused once it is: ``bridge.hub``)."""
    close = did_you_mean(name, [*own, "torch_dtype", "tp_plan", *REFUSED, *IGNORED])
    if close:
        raise ArgumentError(f"from_pretrained got {name}={shown(value)}: no such keyword; "
                            f"did you mean {close}=? (weightplan's keywords are listed in "
                            "help(weightplan.from_pretrained))")
    return value


def device_from_map(device_map: object, device: object, tp: object,
                    caller: str = "from_pretrained") -> object:
    """``device_map`` as ``device=`` (transformers' name for where tensors go); an automatic
    strategy passes as its name (placed once the model is built).

    Raises:
        ArgumentError: both given; with ``tp=`` (exclusive, as in transformers).
    """
    if device_map is None:
        return device
    if device is not None:
        raise ArgumentError("pass device= or device_map=, not both (device_map is "
                            "transformers' name for device=)")
    if tp is not None:
        raise ArgumentError("tp= places each rank's part on its own device: drop device_map "
                            "(tensor parallelism and device_map are exclusive, as in "
                            "transformers)")
    if isinstance(device_map, str) and device_map in AUTOMATIC:
        if device_map not in AVAILABLE_AUTOMATIC:
            raise ArgumentError(
                f"device_map={device_map!r}: automatic placement (filling devices by free "
                "memory) is not available yet; pass one device (device_map='cuda:0', or "
                "device='cuda:0') or a dict {module prefix: device}, e.g. "
                "{'model.layers.0': 'cuda:0', 'model.layers.1': 'cuda:1', '': 'cpu'}")
        return device_map  # an automatic strategy: resolved once the model is built
    if isinstance(device_map, Mapping):
        return dict(device_map)  # ("disk" entries: offloaded to offload_folder, as given)
    if isinstance(device_map, str):
        import torch

        try:
            torch.device(device_map)
        except (RuntimeError, ValueError) as e:
            raise ArgumentError(f"{caller}(device_map={device_map!r}): not a device nor a "
                                f"strategy; pass one of {', '.join(map(repr, AUTOMATIC))}, a "
                                "device ('cuda:0', 'cpu') or a dict {module prefix: device}"
                                ) from e
    return device_map  # one device: explain checks it (a string, an ordinal, torch.device)
