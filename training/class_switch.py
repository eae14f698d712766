"""Switching a model's layers to fused kernels in place, by class.

Each instance's class is swapped for a subclass, `Fused<Class>`, whose forward runs the fused path where it applies
and the class's own forward otherwise. Parameters, buffers and state-dict keys are untouched; one subclass per class.
"""

_subclasses: dict[type, type] = {}


def switch_class(module, fused_forward, applies):
    """Make `module` a `Fused<its class>`: forward(*args, **kwargs) runs fused_forward(module, *args, **kwargs) where
    applies(module, *args, **kwargs) holds, the class's own forward otherwise."""
    cls = type(module)
    if cls not in _subclasses:
        def forward(self, *args, **kwargs):
            if applies(self, *args, **kwargs):
                return fused_forward(self, *args, **kwargs)
            return cls.forward(self, *args, **kwargs)

        _subclasses[cls] = type(f"Fused{cls.__name__}", (cls,),
                                {"forward": forward, "__module__": fused_forward.__module__})
    module.__class__ = _subclasses[cls]


def original_class(module):
    """The class a switched module had before (its own class if it was never switched)."""
    cls = type(module)
    return cls.__mro__[1] if cls in _subclasses.values() else cls
