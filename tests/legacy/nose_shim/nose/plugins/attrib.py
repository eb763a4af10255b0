"""``attr`` as nose defines it: set attributes on a test function or class."""


def attr(*args, **kwargs):
    def wrap(obj):
        for name in args:
            setattr(obj, name, True)
        for name, value in kwargs.items():
            setattr(obj, name, value)
        return obj
    return wrap
