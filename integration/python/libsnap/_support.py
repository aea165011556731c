# SPDX-License-Identifier: BSD-3-Clause
"""What libsnap.torch knows how to snapshot completely, and the check that
it does: a training stack it cannot capture whole is refused by name before
anything is registered, never snapshotted in part (docs/torch.md).

Optimizers are known by their exact class. A subclass may keep state where
its base class keeps none (an attribute, an overridden state_dict()), so it
is refused unless the user asks for the generic path, which snapshots what
the optimizer's own state_dict() returns and restores it with its own
load_state_dict().
"""
import torch

# Every torch.optim optimizer whose state_dict() is Optimizer.state_dict():
# per-parameter state (tensors and Python numbers) and param_groups. Their
# state tensors are registered by pointer (zero-copy), the rest pickled.
ZERO_COPY = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD",
             "SparseAdam", "Rprop")
# Known, but their state holds lists of tensors (LBFGS's history): the
# generic path.
GENERIC = ("LBFGS",)


class UnsupportedError(TypeError):
    """A model, optimizer or wrapper whose state libsnap.torch cannot
    capture completely. The message names its class."""


def qualname(obj):
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _torch_optim(cls):
    return cls.__module__.startswith("torch.optim.") and getattr(torch.optim, cls.__name__, None) is cls


def _is_zero(opt):
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return False
    return type(opt) is ZeroRedundancyOptimizer


def classify(optimizer, generic):
    """("plain" | "generic" | "zero", the optimizer whose state is snapshotted).
    Raises UnsupportedError naming the class."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedError(f"libsnap.torch: {qualname(optimizer)} is not a torch.optim.Optimizer")
    if _is_zero(optimizer):
        if getattr(optimizer, "_overlap_with_ddp", False):
            raise UnsupportedError("libsnap.torch: ZeroRedundancyOptimizer with overlap_with_ddp=True is not "
                                   "supported (its local optimizer is a functional one, built at run time)")
        inner = optimizer.optim
        cls = type(inner)
        if not (_torch_optim(cls) and cls.__name__ in ZERO_COPY) or generic:
            raise UnsupportedError(f"libsnap.torch: ZeroRedundancyOptimizer over {qualname(cls)} is not "
                                   f"supported: its shards are snapshotted zero-copy, for the local optimizers "
                                   f"torch.optim.{', '.join(ZERO_COPY)}")
        return "zero", inner
    cls = type(optimizer)
    if _torch_optim(cls) and cls.__name__ in ZERO_COPY:
        return ("generic" if generic else "plain"), optimizer
    if (_torch_optim(cls) and cls.__name__ in GENERIC) or generic:
        return "generic", optimizer
    raise UnsupportedError(
        f"libsnap.torch: optimizer class {qualname(cls)} is not supported: libsnap.torch does not know where it "
        f"keeps its state (known: torch.optim.{', '.join(ZERO_COPY + GENERIC)} and ZeroRedundancyOptimizer "
        f"over them). If its state_dict() holds all of its state, pass optimizer_state='state_dict' to "
        f"snapshot that (a pickle each save) and restore it with its load_state_dict()")


# Wrappers whose state_dict() is their .module's with "module." in front:
# snapshotted as the module's, so a store does not depend on the wrapping.
def unwrap_model(model):
    """The module whose state is snapshotted; raises UnsupportedError for
    wrappers that shard or hide state (FSDP)."""
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedError(f"libsnap.torch: the model is a {qualname(model)}, not a torch.nn.Module")
    for m in model.modules():
        for c in type(m).__mro__:
            # by name: torch 1.13's fsdp package does not import on Python
            # 3.11, and an FSDP instance is refused wherever it comes from
            if c.__name__ in ("FullyShardedDataParallel", "FlatParameter") or \
                    c.__module__.startswith("torch.distributed.fsdp"):
                raise UnsupportedError(
                    f"libsnap.torch: {qualname(c)} is not supported yet: its parameters are flattened shards "
                    "whose layout libsnap.torch does not capture; checkpoint it with FSDP's own state_dict "
                    "APIs, or train with DistributedDataParallel")
    wrappers = [torch.nn.DataParallel]
    try:
        wrappers.append(torch.nn.parallel.DistributedDataParallel)
    except AttributeError:
        pass
    while type(model) in wrappers:
        model = model.module
    return model


def account(opt, planned_state, planned_groups):
    """Check the optimizer's own state_dict() against what a snapshot holds:
    planned_state {index: {key: value}} (tensors as registered) and
    planned_groups (param_groups as saved). Raises UnsupportedError naming
    the class and what would be missed."""
    try:
        sd = opt.state_dict()
    except Exception as e:   # noqa: BLE001 (1.13 raises KeyError for state of a parameter outside its groups)
        raise UnsupportedError(f"libsnap.torch: optimizer {qualname(opt)}: its state_dict() fails "
                               f"({type(e).__name__}: {e}); its state cannot be accounted for. Nothing was saved") from None
    missed = []
    for i, st in sd["state"].items():
        mine = planned_state.get(i)
        if mine is None:
            missed.append(f"state {i!r} ({', '.join(map(str, st))})" if isinstance(st, dict) else f"state {i!r}")
            continue
        for k, v in st.items():
            if k not in mine:
                missed.append(f"state {i}/{k}")
            elif torch.is_tensor(v):
                w = mine[k]
                if not torch.is_tensor(w) or w.data_ptr() != v.data_ptr() or w.shape != v.shape or w.dtype != v.dtype:
                    missed.append(f"state {i}/{k} (another tensor than the one registered)")
            elif not (mine[k] is v or mine[k] == v):
                missed.append(f"state {i}/{k}")
    extra = [i for i in planned_state if i not in sd["state"]]
    if extra:
        missed.append(f"state of parameters {extra[:5]} that its state_dict() does not report")
    try:
        same_groups = sd["param_groups"] == planned_groups
    except RuntimeError:   # a tensor hyperparameter: compared element by element would be ambiguous
        same_groups = False
    if not same_groups:
        missed.append("param_groups (its state_dict() reports other hyperparameters than the groups hold)")
    if missed:
        more = f" (and {len(missed) - 5} more)" if len(missed) > 5 else ""
        raise UnsupportedError(f"libsnap.torch: optimizer {qualname(opt)}: its state_dict() holds state a "
                               f"snapshot would miss: {'; '.join(missed[:5])}{more}. Nothing was saved")
