"""Counting calls of Triton's own functions, to tell what Triton compiled
(or built, or benchmarked) and what it reused. Shared by
hack/triton-fleet.py and hack/gpu/cold_start.py."""


def count_calls(owner, name, on_call):
    """Wraps `owner.name` (a class's method or staticmethod, or a module's
    function) so that every call runs `on_call()` first. Triton makes some
    of its backends' stages methods in some versions and staticmethods in
    others; the wrapper keeps whichever it was."""
    attribute = owner.__dict__[name]
    is_static = isinstance(attribute, staticmethod)
    original = attribute.__func__ if is_static else attribute

    def wrapped(*args, **kwargs):
        on_call()
        return original(*args, **kwargs)

    setattr(owner, name, staticmethod(wrapped) if is_static else wrapped)
