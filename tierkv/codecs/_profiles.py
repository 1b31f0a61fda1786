"""Sensitivity profiles for the ``profile`` scheme of the cachegen codec.

A :class:`Profile` holds, per (layer, K/V, channel) group of a model's KV:

* ``codes`` (int16): ``8 * log2(F ** -0.5)``, rounded, where ``F`` is the diagonal Fisher information of the
  model's next-token distributions with respect to that KV channel, averaged over prefix tokens (the first
  token, the attention sink, excluded) and continuation positions. The codec adds the level's
  ``8 * log2(step_scale)`` to get the step codes of a block.
* ``order`` (a permutation of the groups): the groups sorted by their mean absolute centred symbol on
  calibration KV at the default level, the order in which their symbols enter zstd (groups of similar
  statistics together compress better than any per-block order that must be stored).

A block written with a profile stores its step codes as deltas to the profile's and names the profile by
``digest`` (8 bytes of SHA-256 over codes and order), so a reader needs the same profile registered (the
built-in ones always are). A block names a profile by content, never by a name whose content could change:
if a later tierkv recalibrates a built-in profile it must keep the old one registered, or old blocks raise
DecodeError (never decode wrong).

``smollm2-135m`` (30 layers, 3 KV heads x 64): measured by ``tierkv codec-eval --calibrate-profile`` on 4
ShareGPT conversations (seed 1000, 1024-token prompts, 127 sampled continuation positions, 4 random-sign
probes each), disjoint from the evaluation conversations (seed 0).
"""

from __future__ import annotations

import base64
import hashlib
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigError, InputError

__all__ = ["Profile", "find_profile", "get_profile", "profile_by_digest", "register_profile"]


@dataclass(frozen=True, slots=True, eq=False)
class Profile:
    """Step codes (layers, 2, channels) int16 and the zstd group order (a permutation of layers*2*channels)."""

    name: str
    codes: np.ndarray[Any, Any]
    order: np.ndarray[Any, Any]
    digest: bytes

    @classmethod
    def create(cls, name: str, codes: np.ndarray[Any, Any], order: np.ndarray[Any, Any] | None = None) -> Profile:
        """Validate and freeze; ``order=None`` keeps the natural group order. Raises InputError."""
        arr = np.asarray(codes)
        if arr.ndim != 3 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError("profile codes must be an integer array shaped (layers, 2, channels)")
        if arr.size and (arr.min() < -512 or arr.max() > 512):
            raise InputError("profile codes must lie in [-512, 512]")
        groups = arr.size
        perm = np.arange(groups) if order is None else np.asarray(order)
        if perm.shape != (groups,) or not np.array_equal(np.sort(perm), np.arange(groups)):
            raise InputError("profile order must be a permutation of layers * 2 * channels groups")
        c16 = np.ascontiguousarray(arr, dtype="<i2")
        p32 = np.ascontiguousarray(perm, dtype="<u4")
        c16.setflags(write=False)
        p32.setflags(write=False)
        digest = hashlib.sha256(repr(c16.shape).encode() + c16.tobytes() + p32.tobytes()).digest()[:8]
        return cls(name=name, codes=c16, order=p32, digest=digest)


_SMOLLM2_135M_CODES = (
    "eNpVnOe247iSpfVi/WOme033vVW3TGYeJ0eJogxFSqIob85JW9Wz5qkn8MUGTvbikkSRAAgCYXYY4FvnjeObfW6d184P+3y1s8+d"
    "e+eLHXe7c+18t7uHzqpz7vxF2Ztde7UyX7hz4yzUeLO6Vzv7bGVe7f+rHaHkd/sfan7nCW/WzjdKfbezs7V86OztOFrZc+fEv2un"
    "sf8na2PV2dn3xZ6w70ytXmPnF3vmV7v71mnt7qmztTonKx9+b3b3aM9prY0L5xer/9W+51b20JnYUy/0zFt5te/Qh7tdv1srN3vS"
    "2VoOPff+7LhytzKVfb5aP35Y3/+2kt/tuNkTQt9vPKPlWWfe+saIXuzfd7u/4yy8/42yP+zKt85Dp9t5sU+382znvc7AzgZ25dm+"
    "B9x74t6TnQ24E0o/dfpW9olyPft+tE/Prve5/2xnod3Hzif71+dqZvfD70Mq0aXOkx0PVu6p8wdPCjWfOr9YiU929xO/n7j2YO09"
    "dz7yrNCfj2rtE2185HihRujzM3f/pG9P9nngmrcWrj3yz///YXf/Rc0P1sYDLT3wVH/yB/v+QL1wL7Tm5UIb/6VWPnLngeNP6n20"
    "70c7/8N+/51roe9/2Fno7ydG58FmtLbZqzobm6E1FFjZd20zVdvMh/kvbEbvzFmg54FdPRsNvhqF3K3k0s7nNus19fdGHxsrsbJP"
    "TZ0rrb5ClVe7Wlp7V2j8DFWfuX6AMg9Q69F+j9ZiY/f21trZWjhDyaGnubV0oF64G76PfJyHjrSz5XprT9nDBVvo8UrvWj37rDZ2"
    "1npln8ZaX9nv1n639ruxKw28s7UyJZS9hwMCnzU8K/BsYyVXVqehztpKNIzf0Upu4Z5Qd0H/w7vndm2beL61/zM7cuPKzLi74Cx8"
    "xnZM7U5hR9YZca+w614mfIf7U/v26zk1cjsPreW6FstNqDnkbkE/Cpu1ibW74NqMkuF5Y1oc2525/Y4oE1vx3kytP4XxhvcmPr/g"
    "KSPKTCgz5fkj7hXwYUaPQ2tdSk/tGTPrwcJ6NLPzOXWWdoQrQ2t7ab9Tejexa+ETzhf0Ovx/YvxKnh7eZ869cGXOW/l7+rUZZRZ8"
    "cj17ZnMWKGDHzO2MRmqo5sxcbm1+lvbbQpG1td9ArXdmfmut7K1ObfcryoaZXiNnT/aMNt0pobuj0UmPmmfkbGg3UNkK2gnnfgQq"
    "XFm9Fbw143dp/S1tBMM7lrxD6H8O5dbU3dLj8FlD0TVjsLb3r+0Io7u0EZ3Rhv+bcfYGlx55r8AhdzTIjhEIemPN/QpOnsF9gZvP"
    "UHbQO69wb9AkJ/s+IUECD35GE1wYsTujepKUOMPlB6TAXlQwTHS7gAInUJ9fjxRa8EaBxoea2RG0Nqam0/iEd5rSSqCzUHJJG3Mr"
    "PYT6ckYuh1YX8F0OHYf7gYsyOx7huT7XJkatHyg3Vr0xpTPOQp0BV36z85799rme0Wboq/eyCz963b64bETfZ+r5TJxU6m3DWDiX"
    "hD5nfPwtC9HzRLTvY7ikjvPFnHGYMBY541NItvjoTBnTzD5BzgaJGWTRBXm7hRojprjoWCE1A12foZYj/87U3sMHQU7uKdci39aS"
    "cmeoowKNHOyNL0heRylXMM6JGi0tnWixRrMc4aKd9XbLlZ7prsATgdYXempr/xx/bOjNkb7vVKO0s6O9687GI/zLrO0gUSq7Frhm"
    "zFu61N/D6xu7s7bSQa7P0AW1Xff/j/DiDL5aWSsbxm9Dn5bW5pKWgi6dWq01La2sxMiuBR6f2qe0z4S7L/Y9B8n00dqONfro84/2"
    "ro9gGMc6T7rvuv8TZR50hPNwNaCKLqjgQfrdyzyCRxxJBAT1YP3pUTbgpYiteqo/4HgSQurz/ZEnDEFeEUX1QWg91e1y7vdC6SHn"
    "Xd1/st9nZHUoF+r1wXrhyMQ9Gc/ti6tG0HuP89DSAK7K0Bwj+5eD58LdB/s3sjbHtN+jLxmcFp41hQNzqz20/0Nx0QC+7fPUA9Tj"
    "VLeDohoocSuJWtnRGrUFNNC1sz5zHOR0kEaBW07Q3C7hjT2IfQUfNcj/LTJ6D9cukfmh/hzccETWHsBYrUnTA8++2P27OOsO992N"
    "V96sbA6Ovuh/qNPSxp6nX6StDpxfxX1HSegjaOQVdB+slDO2g6P/qz3ReXaLpbOHCx1Z1WiGNYjLJUDg31Z9f0Pi+wiGMdjAiw08"
    "eKYfLZy+kMwYiv93VvMiGhkKjfdEOy9IX6cip8RAB0OobCgbIYN6+kjWPvM/gP4D8h6KRvrQzpCW3X5wOghXcqjKqb4vLnhA+j/A"
    "hy/wwQMc85Jsixd48EV45hO9+xMr5BlecnvAsX1fdsATT884/wAvOl+Ep3wUJz7xhCzx0oDaL9B2j/d7hl6f+f8kC2go++fJ7rhd"
    "02fknJN8VJ54fo+xeKQVt20euVra4SjknDDs1qh0hcwMOKyyehVybWr1wp0NpQqk4Zx/O+T+jna2SMQ1FF7pdwXdr61vK/BI0EaO"
    "sIMVfYP634w+3qDXV+GJO/SyFmY42Iw1aJktzxlDY6+08BXb5AZfHKHWi2yLO7TvnOAo/wB2O4D5GnScc2tr3wu06wx8FbTEDCS1"
    "5DvwbgtCcCS6AJcd0ZFH3mUBfl4IbSyE3Oag2Bo0O4RKapubyuZoIQyegXX7tD1COo1E3UOk7gjKHUHRGWcj5ncodOItDJBvGZJv"
    "qBYGoJahaGuIDTCE5wrJz8Arj1D4k6zrF+jYrXGn3ifZuUH/DrCrn8QzfUq47vAaT9JBXSizm7irSzvPjMATtmyXfoS6ObS84Nkj"
    "qL/PO3S5/iIc5lzfh8r/gL+HvF/fxmCoUhl0PWSEBrxrJr9An98uvDFIUiHDjv0CDblMdOp7gwLP0OUVujqDka5c34P03WMT6jkF"
    "37jr9uyr3XMKvgkfB/RxpsWJpPUZGbuDJvfwUAUN1eDkGtsjaI4pFBiQRCarYAyKqKG5Ftpt0FJux67QWiX2yA5LoqKdCoRSQY9R"
    "s1VY7RsslC0WSo30Dxpvy1Hy1lO7ErDLQPbMGK4uQV9r7u2RAxdZMm77hKs1fRwhNfqMoevOkvduoJhnpH8fydkXYvgkSe6UkiUM"
    "0U+S7oE5fBbdPkv6vUA/XXDIC7T4AOJ4QG67h2dAe114qQey92vR4+RoZAj/DCRPh6CUMdw0kKR+gVcnoqsJ1/1uxCFDOCkT3Q7V"
    "rlsZXv9F6H4If/fBLG4pFOi1DGng1kaoPaGu96mgV5l4oS9kFOz1Pvot8MWCVt0amdLHUC9yzwDr7gQ1XoVljmjzA3p/J9t3g5w8"
    "M+MbtH6QzIGOrvKl3MAfB2n/I1ZuA55y23mHpBzQfvi3g94O1HLUtAN/VPY7w7YukJM1aNqpujRqmNjvUtQX8PRJ+MvRm1vUNby0"
    "BOUHeh1TI/zPob4+rdbQZAv3bPWm0SKv4Z4Ffo8+fQmetK4o0L+D3v9T4+F82NLLDTpyhQU+YE5G+CdG0ONQujtgiN9BA0/M5ZN8"
    "lC7nHPsE+TyAM4ZI2QFy8EU2QpjxAkobieL6QteO2x07vOgINq2j+aHxwpRWcuzVQpqmoK9PWAdjaHSInnCrN1q7Q/RLH5rKocyC"
    "fge7tAcNj+CnEbjMvVcZ7+GeILeRu6LdqMd+p9RLwnh+DISzXI47F4e7f6A5MtV95O0HRhvO1x8l64dJPwTJ4Bzjts+Q/xnvWkIJ"
    "I0Zjyhjk8EaY4wntOM+PpU9fQIkfkBihV8FfM2d2R2phIn39IuoZJJ02wKMcJJP//2CfK/rmFV++exsDkr6iXy7ipOgfPVo9t6ob"
    "qO5IyTNW9BmddZH9cAXPne37KP51z2gJj+ywiL0N94nuQG0u9zei/w06Zw12KUEyBR6nJfav65GV2mllL7Xomxr6L7GKGxulUDe0"
    "Eeh/CTcGTVfSVhc+6DI3fVkBQ8n6IZT+URq7nyzSHjI1lHzg+5nR7okzHhjbR+b0ERQRLYJnlXUL40XYIOJzR1ADKKQvLPUoNN7l"
    "6gNz31M5p/IndEAGJfb59wCPDlKE4kX9foRLXpAjA/BSoLI5uHKGlzODX8b4Z2Z8L5DmU8bc9UIuz9dMntQRfp65PEBT/GZTeYdy"
    "lcr5nuEVC+M/ly93glfkgG23lad1TqtzeZhKUO6C38p6W/A+7kOraXGf5j5gjlyoeI5fagFOyalbSxoHaVPBU3Pwdai3SLUKru3x"
    "j+zsyoHvrbxRQys9wefSQmklUYYamivVzgKsVKJR1tB38KBe0GCFtfKCtN9Kb7ie8tjDUX5U9+g74q/pSQOdB2p/tue36LU5WGwP"
    "Z7WMwlneYvfJRiwX/ER7WnAv7prWnWda8M9YtDNBphXI+BHyNGMWB5KqY36dQseS3H15SjLkz4RrWYoHOCLJ0fcRJwygH0cBGdJt"
    "JDyxYGYH1CzxGQ6FEzLqTaQnJvJE5vJ8DhR7CHziPs+PvEVJiYnsJfeK5siQEfzS53/0+DimGgifjWQdeORuLAw/lqQfJpQVvwfi"
    "6j6lBvIeZGp1CCeO0HdDeXLdehoiJbfMYpBRC/lct5J8G8WUcnyUG6t1lXflJBR0kMTdQFclki9QxoT6Ddxxtn400OsTNNfg/Yje"
    "zhL70BHKAorbiorW0FUNvbag/TVzs8Ua33NtpTo1tb0Vtwdq+XJHyPeNMM4zZ1voekvUw71HbhNH69pRfNAMc3rsiGvHuHjUa839"
    "I6jO+axhjPaqfaLfOzinpc8juLmL3jpYizvQ31h+9TFSKod6x6AK16RjqG+s+NhYeGosFF3IFz9SqTH3psSfYhRtmBDMEAvYbcmJ"
    "4gGuxSdgpfCEnjgjF4oYSaf7tYiSeuLSsTjKffojccOEHo3QGQNaKuh/T3a6Y5EXJH4Op4/1ti6Bc3kR/A1nikJMeOcijYhrghl0"
    "PaOkxz1mihkUGlOPA8xkVcRo45RYygL63IPs9/j5JlijC9B9y9UDdH3Gkh1BzcEDmdsszgy3HCUPN1iTFyTeFhm+AcnviZat4JJX"
    "K/kG57Qggyv45IokPhFtDpbyDql8k8XxaiWDf/GGH9Q9ia/04EpU6qI4Uqzvvp89dfY8063sYKGsGa8rx1GROI9a3RTPanmGWzs1"
    "b+7xhRbvqUcHG6yOC7GGA7W8tzf12+PWjs32iq23tHy2mbvBRSdslMDBE8ViclFBTqRvIkpfStp6zGdoc5aJNsKsB0kTfT5Bwoa5"
    "HSJLJqKUCroJMdUMyq/R+WNFa4N908ifvUZWrSUzGmyjGAXfJImwVuzj/fpWMcdG19aShU2KZ3qpRhFOly47lfWY+1oyaaPI+0o6"
    "csXRMILuydjI+7hRa7GVLVgztLSgbA19rRXRb+SNXqWW15yvob+dbLiD5FXAF1PFd9xeDCMc2pvwrC7SrMHO3Ch6sJVF2+AxDHGh"
    "xka5xXNawfWBm36jdx+QpUE7jOC4VzxIn/m9ybN/kv/SbW73OV2gsT59PsEJJ+j7pkykkIV0hUvcC+U5OQdaPNHiWRx3IVPownn0"
    "zzsXt/Lt7oW5TuiOHXWCRAjt9OFg9xB4jtJe5XxuGzhmrTyMrXRE6E8GH87hhjmaokGaTRQnHcl7MUR+j+Q/zOCEiTT5RF6OiTwj"
    "Q9mQY/FJrqtRQ3iOxCR5Rx3huG0aarj9s6fXLXS51Ti0iuq0urMVYtsIJ7aKP+7kP9jgQdhwbf9TbY8lNYzjPrXWSueuxQErcZ/n"
    "AzQJiUZ+WstPEcvE+NQKKvQaMXNlCwLZiKvdN7hV+xtZehUc6bLqVVL6jpTfEAt6Q6+7R/PNZv5NEfuM63f8Pe6VP0o+7qCLoBHu"
    "PDVIv89Q45s97Y7vM/h+PPpzNgp4pf0TFHjWGJ5A3Suo7Qj+msiP2aAbHmX3ntEJF5591MgGfXWkXKmI7wI95N5Wz22bKB9uaFcL"
    "9fko2t0l+ROkXUH81n31LmWmZqnO8ceW+PdnZuu5F/cIL2zlc91i8Szlia3g+gWadUTUcAmeKpHzJR6vSjZ3tDcaLBr3LVRgwTLl"
    "GLl9UcrPtBHmK6k7xy5z+ztGapayZjY8q1IEfYlnzG07t/AXRCyqlI2zwIpzm7Il+rOk5SXodoHVulB2TYMVW5OjUcrXtoTuat7E"
    "+1gj+WaqueJNJkIvbt/MQDnuL+vzbyQU51jQs4+ct4eUjfpxLPw3AW95axOhownW1URoMUoc/3dS/the8tT9k43oYJneqyKXxG2a"
    "XD69EHO/UOskKbiVJPU4WokeKpnDIHfmRi+eAzZT36eU3iFDXMLUGrtCCK5QLlfAnQ9YQj3wZyZv0k6YfSd5umZm5opkBW0/sKc9"
    "Czd7/MjzHh/JEXD7f5ei32tJiI3oKFBupDrPgHA6Cm1W8i859x2TL6CGf5YqW6MRG6yhSvaRR9SGytNaKDI+5zPjmEM38e5SJZa6"
    "MlWGSwW9zaHUOW/t410q36tk5hbyr3hkz+2tGTQ8VTwtk+8yky08TnkJPUWfMnxHY1kfI+zXkfTPMOmiTKg/RqW6GvOxcooGis+N"
    "pO/6sv2W/Fbq2wJOrqC8Su9VqoTHJKv0bykfzVIeEJ+bZfK5LEWFS+XVVelYUTPmuVVIX0eETcoY68qXM6YPRedXLNy5+jcGIx3I"
    "vJlLC5YgpzX0t5GdtUCj59LsU1oKPftTUeAayvAMTO/thHmtQAMLel2ixz1HcCAP14iIUpN8Kt7CTL2LmX9D2gzU8kGZhL/CG/PO"
    "R/ofeXSurKxMnJfJUszw4I3kc/hN/og+EaQP2N8rUWOeorB58oT35X902zBDcjm99cjQzeU3H8gXE33mU1m5I12bJhs30txCuaDj"
    "ZIkWih1PRIkTtfPuBXIE1RdFZsyE+2TcJuwLM+WSlwXWbXyXsbLqJuArz5wrfiqbyRKfyPdSKDt0JNlcyC4fCe+5rHZr2S3pmPWT"
    "qZbzi/NlJiSY6Z37ycqOsv+dI/MUrejKv5Wr5Fi9HMOlPfIX1kjui3w9GzDDBWm4FzKcIxkHYIUXaem1eGwjtOuIeIOd0SLzHA16"
    "9sMen0cLd7i+dd/n6//ImmxBTZV88y01CtngQbo+0p+W7Gz3t7+BgXbKx1nR7zXW0J7shjNI02O5B+z6WnmYQ/lRHQduk83nHqmA"
    "DgokRFdoJ+iSX6xmTo7cn7x7Td8a+aKqZA3WvHVADDl4oEL2TOQjrKg7l391JRlYCYNU1C0V464Zq6hJK3x00d9VyddWKSLh0e0a"
    "GRTlqcu+StGGlXqy4rlRPpZCO17S/d7v3mTXMUu9b5Vk8EKapRL3L1I/6yQlZ6pfS/Iu1LeKJ9ZksYR8vkzZRZ/ItHuUhu+lrKjf"
    "iVB0FTt7gIb/wK/ZVZ7gSPl1ITY1UKagI4RPkkIxgu7Rkb5ibLWk5ZzZrhTDKuTzjXhhRFT8PTaXiVNz3qyUdport3TO3RlZ3j0+"
    "fcmeUecfxP6eiNX8at9b+KVhZCNqdW1eKC92ShTSvcw+CgPiMCGC8qu8C2vZUEv53T07uoefZCIf3IiskZ4yBV5YbfEv+LaRr2Mj"
    "+7VA44V3ycD/JXMabPlfhU5GwhKV/LgtUqPmPTzzsyDjZwFuGig73X3mU+nrELGcIkUnyu+NPruJ0N9EschJkv4z5QXMlGHsEZ6x"
    "ZKnXG0rCjtG2hXyL7l0dqbTnHIffgSLL0Zs+QLIOUs7MoyLQmb378KcsOv/9F7kbA6Kw3URTj+QKDbRyp6f8oJjbF7LPuorHdcVt"
    "M8W3PHd/qoztWcr9L1K2c674lZefawxiBCyuJZgpv3+uKNpSmLJQRrWvTKiwMbfMnWcVtGTCTG1Wx1BmkejLI51r09mNsny72Ho+"
    "/we10yJ3Pbsg0HNOrT1yv0YO5mCVmbwFjfz6buvF9SeF5FXOKAxAsXOk1gb/v0cqQsTmAX3jMV1HcLW4YCoJVEryVYrY/kbujuPE"
    "abI2fPXFXL5jx8RBynyEU/8J7umyliisH/rNjt/t+E87KiHLmeJ3nsXi2Y4eMc2sZIjxhgyKsDbpg53/yz7/6PxH53/jtavh+LXy"
    "BrfyIa8kpaO/bqMYykpeKpfxDXOxlo2xSmiw1uqLjTKlol0yk6ZwxLzGIo9rasZaR7IQBnROW4hrCrhuqpUJRSpRKAffUVCVKC/X"
    "SpO5Vs2EGYvrD2ZaqTBTZmk/Zbp5Zskg5dk9yd57kex9UW7DC1I/clw/Ze51lTvbTZ+hsppelIXUE6/76rWtkPdGunCpNTdzvM05"
    "0nOMFPc4mkuyoeTLRDq60hyW4tRM2DMnYvoJf1t421+0IudfUPYnzh09r4kR+CzOlCM9RZZXya8QerOSDVeCFh6gBEddNQgrepG3"
    "PME9uY3aD4h7qQi3r5NYKjvO432eT+oo7CCPwAaEuAejBX9w2/kMRQRvaygdZOgRv9Udag2+rh9kMnlcMHiND0JYX21Gt/gXPEoR"
    "PGXRE1JKk06lU1fKI3WJWIJaFozUUvxdap3TNGnghaw09zG5BC0VF6yFdipGcCUfwVyScgk9+vqaKCtL9Wehsa6UGVAqf2AmKzzm"
    "DXjktBRqdA28VD8LIaSlVvMshAeXeOXOVupAhOSGJL0h0w7y7sXceo+gtOTI3MnrPXD1xOj6GpIjHscDvspWcR/H4638lBfFmzwK"
    "c05+1QU5A0F6j6HpsTyvvurL/TQLRe49ctCFhlasGzlxNa4FixGVFr9lF293oMlHefbeUe2TJNNK8t9x4gwecwtrID/CWPlaA+UQ"
    "d00Gv3T+i7pbodmlJJuPd4/4/jPYqUdWez9Zo75iNiDPRhbPu9eqlv9hAdoIyMFX2T4in4IU/2g1/+z8H/v8IspuZTlskSQLfKUL"
    "ebo8B2sIXov578/W+0/W+38ijbdYO9sUud7I317KD14xekv5lSrFjfyN3Z+0TaPnvvmScj4qM+I1yxRN8vjWWpgvV3R4Ijt2kqzZ"
    "iVZLjuVdzBUzKNK6Ko/YDdPaKo8Se5bbRJG3/Kc1mbl8cn4+1jNzRS3ydCfWnKjMWN7KWC9PEeP3+7mw5fszx//DJxpLjeUziDVi"
    "fthOOeyNbKRaemACPY5+GhvHqh+hzk+Md8Q+nsu8luyKFpL7IoP0/iTNORSufyHTYqNIRamViqu0EnVGvtko+UHd7/aIJurKPxOj"
    "Gq6D1skOmYHhC0mhZ97kI73/JflPA13uUnSmlR1QiQPnmv0ZczrQ+rx3L8sQC6b96djJT7qUHVQKu/akK8fW91yZxH3lAzjimsFt"
    "LpELabt3z+dcEjki3EXyd0b/6Fy4ZKGrC420y+EyrXyda9VnkbysC/mRSo1V9K0W8pEt9AyXB35tmvLJ4p15yidz/95M/ue4Qjnq"
    "3EJao5SnNlf+k1P0UBlHbuv1U87T+1rLuErC8zFfRMnZT1lQmXxpkxQXHyQ/Wle+ophxFK5dyd6/KT56wBPUQk9l0pYLeb9nyLWV"
    "cF7FuxzJ3XQt5rEEl/seL59LF67I3ndPRchiruQD6stvvlWdrRDuUh5M9/sVaIFCtNNVxkgP+9ljT60whkfu58rWXKUVq0NxU274"
    "vZBP0/OODynrrRLeLuUvX4JUfU1tDk1kypTxkX2Bflu4vyU/rtHTy7TWeiyk1QU5hzWyc/lUR8aHYV5i/N+1ai0pvSI/YpVioJXe"
    "baMsgCrF6dxrVcn638r/EltZq0yjWOkq5SmskhZYKPrVwCe1MKxnEZbyOC+QUzP54X2t7VIRBqeKNdbWFKzpGGyD/nqndZ/9mXzU"
    "MbNy+pOfI8rtmBE0/UmmZz+tsveZnFFyqtyRXNSSKzaey6Z5LzHTk9y/G2VZJT9ZqazTQvnbXa3QfNQ+Er5m5z9N5/+ODRcswH8z"
    "Db5R7ZXimYVW2HndjHUcv9n5BzKz3f4L1l+wJP+J/2Uv2Rsz52t5Vpe053GaIaMVaPh3dMlUsmWktb57IaiN5mypbNihZNyIVjyi"
    "E+a2Z58PRBJ2ivR7hMq9coWyKOdppWHkln+wmuSTcsB/7/wvrXRp5fV0H+YkRRC6yhR7kFX3QszwTyzpD+zZ4XItUwxpIP94Jj91"
    "Jq9ZzGXvyYOdyTs+Sufuz54oG24oXTkW9sqkdQbJZx695jHDwSPfrbLAfUVDK99I9A9vlQPRSmMeVLOV/tzgD2mVHbPV3W3KLdmm"
    "djap1ERaYQxFF/LsxGjdJOXUT7GlY/5zjIgW6W7UQIX4I9rn0d8zw4rPf8JHjtlKeX5W8s8upefm6Jou/osoQ4O+93VEwSMbqPk/"
    "tNuC46VomUaM0NeM+u42GXzxrEzysCvLL9b6WbnMMSNqCop1b8QYCnWfbw4VDrRG5Ek+1ZF8+xvZEBuo21cjTKU3esjsnvJnuvYO"
    "fa2pCPGrmJNSpwzTmO/vmYNu0w/FRdGfOAbN/WKtuv3QSDavtAo+RqBjPrn78f5kHN2f8CQfx0y6JWITn/25VljOhUumqb1oec7S"
    "rh7veGchzFMo7/29bCmPzfSnaLGjlHXqcyUreSn9u1LmxloSpVamWfR2e1y75LtWybVWAEVrzuNDa+k2l7LrFFVYSeZUai1eXdKH"
    "Urt4VNBok/Lcl7RfyY4shXs973cpHe7x3bnu+7916t9StmIYgbNW2Z6V4dkqln9U/GgrXN4oqlSD7kvs2tCSY6ej8mtOwjNNWtPV"
    "aKWtrwx5husXtLRiHK7sGvWVzMkd2Ud3eOIruTkteUk3Mv2P2m1lxz4tJdk8W/amCntKXZXDedbuLWdiZxetiVmB7DZk5H1jFsO6"
    "zbAXhe+FFXLuvmj9ja+He9X6tLu1c7Z7b+Qxjfj2dfmfed4X6+l3ViHvQII3PESt1h2HUidW6r/JR+x7D22sXEH2k2c9HURbG2mj"
    "vaTxTpK0UaTOM/Ma2SrblGvZgJZirlgr/9lKkZFN0nJb5YltlMHWEEE8KoPyxmxtyCo8Mp577Ybg+Xutctjuytg9a8eQPSMXkeBW"
    "nrRWq6zdd/ZG9uEJz8yO9do77d3kO+rcNf8HWv5MXLRVPvAOmnhjnrbg9D27od2Y2zv+urt2T/N8Nc/KukM9J9HBq3YtOStb0bOA"
    "P6tW3I3kqGwaXwXvfFcqLuix7I9CwWOTpCPo7hXOOct+aJQLtpZHolHWSlj7Myce6hZlF+l+1dvfk7/rJDzRKB46kdwL2uAPrYTr"
    "C1/9Q3vx+Crlq2yQrZBuKa9/Lp/bRFmTffBQWM3dM274bmPwgx3r7mTGhdVj35Ql90Y0+qr9s/7S3ZMi1uGJ/7fz3zabf2mfu1d2"
    "xPMsah/HM5y1s6v+pmMrUzOTU3gp+uorybEY2a1SrLVWZtomSbCVPNZxlySXrh6VqeVBWit7Zp38RZXy4GrdqfXkpeyEpaII7x5t"
    "zxeOWSkx27JKMZaYI13p+fE3tlzLBvHI5kI6oZa89qde5Qu+4b/8gv35WZR5o1zcLdDp4wal3yUpL3DGVSt4T9o/Le7Q1CoD+AQH"
    "tTxjT2bnFR77YuW/Qb+v7Nl31D4JR3pxRr44x8yVFdYaDe+UtT3lTb4yl3fa2kHFJ+3hdtKKqhPzcpJXe6M5WYFUnq3tr9QPb/tG"
    "hvNXdhA8aB3+kbG5qVdhBYLvlnKz2r4r4Rsy9puk9Cvl3hinHe/5FQq8aTe6Bjl/o9yEnRl/sMPj/7M6fxsdf9F+AGHHxh/2HWbk"
    "L2vji939gRQJbf1lxw+7erRS39jR8G92ivyb3oQx+Zs7/412+5vWwu6PJc/7Ds/V9PJ97Y1nBLv2Pciq8azymKHcJum0S6h8L9t/"
    "Lx93qxYPyXe+1xqfJmUrt9LOcce8k/bPaxi5uHNe3OfMpcpNO0o2lL4oH/2iPe6cFo/Q4gWvu+/1cpceeaOVPXLqyKzulW/zhXH6"
    "Tgb8V/65Rv3G+IZr37j+A3r1En4/zMhn5uyb9tf0Wj+YUf/+onkLI/6XnX1hfr6hsb/T0j557+Lah2XKwiuTH87l/1herVyW1W+s"
    "aWrSjkAxD6FUJkiN/7LC8vQ1PIVJ8JGyAT9hk71pl9Hw8R6/MkaORt6QsoE3P0PbFyJPZzhlwWiGdwnj9BflvqHJPKv6zsy+shJ4"
    "x/4oK+3edmKdzx19f0eCXLTy4AIXnoTpTryX7wRwYPXLAG3v+y/m7IbyRsu+C8YX5TLdQENvwsIuB1bsNbFjLdlFmUpHVmQ2yZ5s"
    "UjRkleyKiHRafWK5FuThluVaPtwmlVqlPP13yzXapI1wk+uTg1ZRhLH9zHvdGYOISXzvmFeoOeKLK+N60S6xd+Sdx5VcIt80pm9a"
    "++DX46qOq+rekf07ocmL9kLY4UGMWelx7fYmZRkchKqP7LJ5VAa787UjtpbWtpImR+2RudPInJSntuPZjebZV7FcQGAn7QR3SlnF"
    "LavOwxz2eVZEqi/kk8X9ow6KrrlMOjHza+3MdqBne62w2fB89xQHPv1LvPgXvHAGzX/TqpjP6JedViiE/eNifvYeHvsC/Xv9r+KF"
    "NyyKK2dvINy7NOSrpNWF3o7F861Q1w7sVBNPatIqoYIYYMleSZWs4rH8oD3Kuqdyl9ZWbBMK8Az3lqyDkEf0ATt1jn0e9rL4nRF7"
    "ExddpIvv0I6fva8MelWpKzrIMeOrqPSq/VlvcOBVe/feEoW+8XHu9hbuGtmIAvw5n7Wb0nftYRz3Rf7GWH6lp69JEn9OZ69ovy+U"
    "uPNMb8/vvYIt3+j3K+36aiWXv2tlru+Tz2gve2cnDt9IezmvH2SHbJXp6DuutSpz0PrSg1raJs9Uq9U4rbDpmpr/H90Vlgs="
)
_SMOLLM2_135M_ORDER = (
    "eNoM1gP/6gwDgOGp1VbNW6u11ap5x7Zt27bt/7F9nmPbtm3btu3zvh/i/l03AIAADCCAB0ABL4ADfiAAEAAJUAANsAAHhAARCAMR"
    "QAJkQAFiQBJIARqgAwZgAw7gAhmAjEAmIDOQBcgKZANyADmBXEBeIB9QAKgG1AbqAvWAtkBXoBvQD+gPDAQGAWnAYGAIMBwYAUwE"
    "JgNTgRnALGAOMBeYB8wHFgALgcXAOmADsAnYAewEdgN7gH3AAeAwcAw4DpwATgKngDPAWeAccB64CFwCLgPXgOvADeAmcBu4AzwA"
    "ngDPgBfAS+AV8B74AHwEPgGfgS/AV+Ab8AP4BfwG/gAgiIJe0AcGQAKUwCgYBw3QAl0wHZgRzAHmBvOC+cECYBhWsbAck205u/xc"
    "PqSd1h5pPzTAGGgMMgYbQ41pxnxjgbHI+G2CFmKhltcKWEGLsBiLtTiLtwRLsqKWYqUsw3KtDFZGK7OVxcpqZbdyWrmsPNZr64v1"
    "1SpqF7cb2o3spnZze7F90DnqHHNOO0+dZ84L57Uz2oUADIgDKpAOGAqMBxYBB4FDwGngCnAVuAvcA+4DD4HHwFPgOfAG+An8Bf4B"
    "AIiDITACKmAStMFsYHYwD5gPbAD2AWUZ0BN6wthsDDQ/mJSlWumtu1Yhu7Bd2W5sH3AOO+edI8BbAAETYCmwEnjA+8gLYpPYKexe"
    "dqPx2Pxk/jBtK531wHpivbDeWCXsFvYqe7/z3lniLnMTgAUsAcKgA2YGs4IQ9ltTddJKWLqV26pqL7RPOo+dt844d7I7293kVgHS"
    "g8XBWiCCbWRZPaNe2AAs3Lps3bd+WkPsj44JZgG3Ug2N0cZC45x5w3pkvbRG2g+dCW4XYDZQDKwO3qSemqesX9YDZ6FLgRxYA2wP"
    "TgLD+nJjvvnM+midc/a6y4GW4HnqCnXGeucMcncBp8wL1i2rmr0A/SE/tP5YS+yldnnwpPxazqrvM4aYB8xDzllnE7gZfE99odax"
    "/xm7jL/WI6cKWIwx5Spm3PpkzbcbAHF9t3HAUsFGYB44G33Iits73elAEzCBVWFsfZeezeoPbqD2sbfk+4lpbi6wN/gfuBfdLx+0"
    "jluvrMEuCzYGH3qj8lX5gKaDRcBy4BSQ0o+a+a1Z7i53GQDpt63RtgZmAvuBcWwW+0d7a610t7JZ9Ofme6ugPd/d4Y4FgmAFcCpV"
    "wR7rrnfXAEdlIKkaZ0zIumk9t5rYueFd7GDzs1UIXGZ8sKa7LcD66H7v/nAQOORtKG4HMJD7f9oPtDFubbA7eN/73luY+cZyeh17"
    "nlsa7AY+tr45U9y+QAzMQ96WF9kLnFHuMGAAOBdsytyQ24Kytc/tCawAbgELzLzWN2uqu8ddCpQFq6Mwe0zeaXWze9lz3QdeP2aw"
    "s1mf/F3enwCNI84VJz0ggJOwccZU45V5xQLsT85GAFTXgm/MQamH2iLziVMWaBZoxpQwF9grgfrgZHA5e9FqCk4FOzDX5CPaXOO2"
    "edUaBcDggURKv62PdAuCzcFigULMC3m4u8CdAtQDm4GtwHhyh3HJwrAUllffb913Brp7wXssAxYJPNFOW4K+2FznQuAD3MtuZj16"
    "msGDInzS2988b92xBtqXqcZMQE8aorXJ+mEtc/qCC1KD7D3gPApk87PzpWHsF3aKscZdBewFqoF9UC82xC1tLnUvOovdguIpvYe9"
    "hj2ta/RlWmHLmeusfnZNsJlxybxnDXXHuyOB0cBp6jOVTz5sdga3gJfBGHs/fNzsh+ZgD4TnGWvdre57+Zr1ASxiWGwB+Zc5DXxn"
    "9gCLMr2BneASw+vOcX/KZ605YCY2s97YqAh44SLMIOmfnFRQZ6J71HruOJirf7cGSs+pCeyDxFSrnV0ZXM+GrZgDY4UC/6yLVBPm"
    "gDzC+OpUBFey67iqQIr9xa6GeX0Q+pr6Ky/RBuknrRHsWTmRfGjuYB/LlczxIIBdNDe468Ct4AmnLngMhJJNjJc6ZMSNScYIa5y1"
    "3O3NDNIuare0akw78APMsQbcmWmo5GMLGa1th30QvqIj7kLpi7xZ/2oiTh4gA1sw1cskwcd6mj3MHZjyOwOAL3ofu7/dkomzI9wr"
    "YA9mhXsD/AcOMre4OlvQKG23ATNgDLAfKAN2BZ/Ku/WixgMTsn+Ba+E8bFl7JlzHHWZvdyfBZ71+Nk06Zs2ys7GY3s+8j2+nprGT"
    "3CN0is+vX9K3WY2YwtwC6aDc1e7n3qAeJU5oFjzDOOVclmEnOx1ifcDBxGi9BMqwk7lr5nEKTm0z9uOP8fXGMW8XNiObZs50g9hs"
    "1IP9pI7RxbkGaFLdYpDYXZaDVhnpsOXWdWsbSLACy8ltzNngQPgzTbFZ4C30RHgKfMRbAjztPWnmdtYC9WmcLaSM1TfCNpuOfRhe"
    "JJ2wdoGIvsidjKrqYeuVMwbkYJmtZX8Gf1Bf6MHaTP1TMD39TqewA/gCrSO4GbhNd7Tn85/gSmhBpYg9HT5HfaC3Gq/AOL8bVcir"
    "7BzrP3cK84men2CdSu40imcfyBdMGjxi9QRr2Gtsml3lZoMisI6ZdDdmIN/VPIyfoWF1HJgRGw/fk6POSzonazkzXBlcD9Y3H+Ir"
    "DBQ7r8XIyswd+aN5V9Zc1P1NzaebirqyCamKDvW+lO+b64Fn8jW9irsBrouusIqxtcz0Th1zCzKGukrtoo/LjdV3Vk/3oLekuDC2"
    "G3wle9Q9sMv64SdelD3uZIZmUGmxfchqNyecns3CdrabOxXdXOwotgabS+7m7kZeeh/RG8HDNGwMMTa78+HNzCf2rWw4AZplVZaX"
    "T8geUTMaGRmgYnZu4IOmOsPoc3IFRk0l3HHwYhxMXQA/gT9pjP3BHtG/mSVtD/NWH27cMoc6HUDQ9rjj2YXmS6oHfVCvam63psJT"
    "6UpsfqAD0IKdan92ajCrwS7MMD0XfIK+RyfYRdoVc2BsLFvEzc6e1w+Cj/SfbFGzlD2L6sqAScL5B5vACPAqPIG+RXdjN9FefXDg"
    "M/vLUeiZYG8oJ9mQKcBC7MPEPIuCNqNFxTNyej2J3aEXcbhTDvWKd/X74ANdcb4465h67GazKjgCXkUv4AfxKeOa49JTnPrMbjcX"
    "tIKeaFW0n8O90KGp4VorYJBzk+7PYfBaZwwQdL54b9CoUtfEHMc5Dm+wzuiwXd3dD+aBBgUumwfhNLeNMw1dTNd2c7NjrcJgR/e1"
    "t6n628rmbOM2w4/pO9oy+yj9OzgbXk3/pTX1UPijdxiWTSyszNVfwc3sg/R57xxahgurq6wfYEfxUKK8ucEu61YOPKVXctnghuY4"
    "AGAmgP3Zr+xVsxu6EK/ADrctbClZkTmm93N4eibzlMrKPgOPUtXtO+AlerE1FB9K/9EbKzXNLA7sHgB3oi1FiJehJJ1G1+Q+0iWZ"
    "CFSO/asXNKdQHvaYdsKE6YPaYr2pEXcc+Kl+EO/FDk5ddbYiS/mS7qLAG3qrfgE4Cy+jN7CTERjdTO+mxzP/tMzsaXk0PZbpY+po"
    "D7Y3C/DdzXxOO3YYv0jYYhV1RjiXgrn1sQbkfvLmxDQizpTmJLq8u839DqwEPXROugobJRE+LXWTnZ+ar3U0I04Xtw+wmasjqspQ"
    "7aApkvPIqcwGdCV9AjqKD6Q9nil6iUAtFjVaBP5RhlrJ9rH1uM3WVrsEcAqcpw+EMpO17XzQwMBIehNTyPxndnK2Al/A6txe3e+O"
    "gjlyKluWGW31cSujPjqvUwdty9zQy5h13dNweXYfp/LDqcZsBbc2mpJ26A3MTuwfkITykb3Ahtx7eL/W350EnAs+Arqyv8EW5iTz"
    "IVgotcfazZbhMkIdubzyPf014FMK6E/wMFuWXcp2BI7gjbmJ9F06ntpOk2xjczCNGPnljXY59yB0GFlKF3azQtXQceQleXFqidUX"
    "nWgOwv8FX2slgQnITKMTuoUabyx3vPZJKA2vbtZw71FN2GHmJGu23cAVxVb0G3mB+gamREMPO32YW/B/TBs3Df4LVmcnsuP0R/g7"
    "+YY5mQk4pdwl0BxkI12NXSIFRUNcDnWgF8MFnEnkEmezs4feQZdnZllT7I1UdybKrrU2Wg1Tk43B9gN6rzEK/GJOsXq569D7sWEw"
    "K0+m+3Cd3W1AAfICPUtflHpGf6cl+K1X1vfSzZBB8Hs6yTZw8kLToOuy4JwFX0Gz6c7OMG0j0huNc4Z7il4NzKXrucuw4k4L9DxU"
    "EvwMzw9kloc7KhrC5uD/aJPtK/bmNpizkLH0L/q5rjE+t5N7EzyEb6M18aa+xvoELSCHQzO5BvQGehqSDW2oNkq1Na/IZ7Ut+khr"
    "OtPI1LDheBm0Ar2O1uxpdF3Wq4rOCNpjrLSzOpndkbjX6YpuYQ+zg6XC0BAsad+EJiGPvWPgNoFSTmm3VuCA/kNfbVV2BkM0uZrS"
    "2NrcQLWqOw85GRxCl2BKsx24dfCVYH07l9PUXUbNo69ot8B26N9gIv5Vr+Y2cm1nLjzDop1ezDmoi3PYe0g/zf6WV9irnSV0ZTcK"
    "DMFzhecrQbYyO8soaQ5g0jljoX3QRmwhOoxs7y6FywQQewU+wLwGvYRd6ClShSvqNnevQEu8+bCbUmlmj52L3sB80tdAo+jCYoJ5"
    "FN6v12Hqsw3YIuZ6pww71M7j/KH3s28lNZmmlUfmsn/MAewC+CnehW4kXta3sSPsvu48MAY3Ut5rdUCQngftwNujC+iL3hP4GprR"
    "o9BXuj/a1Z1E/9Q72D3cZKqyuQ7aDn3XH4Fr6Z20qI8175qnoAJhgp5F29ACqCgK8ik5pz6HWsVMMPbamvODBt01+JfgJArgDuvt"
    "3Nl4Q7dgYDk9nROgVdAuNIot1d9R3bg5ehr0JjiFlp07Tho7VFhg5YcyioOgtchW+qPWjx3Cn5d728sCg+jKwKDY/lhHp1GgHtPX"
    "HI/Cygr4iDyTLsE2DCyzVPsPqzsiODwwg24cqM0UEkdrHPZCV13QUz7wwzlHX6drspOc7uQgphRSDF3pfIMHJhZje8n6blKv54jY"
    "VHw9tZBew8xj+0GH6PzOZe8EoBY0BC1Nd2Qbu3mxCmRHJiBPtAu5g8iz1HXqYHiQUsI9STVynnqHwl3Is/RwrozzQX4fnEBlFeei"
    "m/RJUFTfYDQ3numfzRbMT+gAROjZ9AlOFmwI+032OC3c9OHT0C7kGt3cNJ2UeBzZCUfYBN8bOU9zTgc25XzQi2CA+wz6CL0F12FH"
    "E9ugpiaITsIX6YOt1qypPEauaZKTArfgk62e7E3zBtuZ/IA3CRRSd0OtkH36Xgj14/pGnXKW4OvpAzEP8ZtexL8LvosWURL2fPQJ"
    "BIT2oVucZmwOJ+X+Rx+goXgN4D/oCPQc2kX9x37Wezs7qQfimeAaM7OzJDCDTUjtme5su4AWaeu+RNaRPkd35zBD4JHYQDxGj9ee"
    "eTdw77TlYFG1nXkNfgo3Fm9o3/RFdFP2PLsktQ/+SF2U74FDoFtQbXayPhFtxT6KtWY+yYvVWXha4KY8C7oHb0D+yMu0nGA9dCI5"
    "l2nPNlJfmpmc7UxRzgxvQzsxo6hxdD/mqbUwpRvN3EPgcJrU2yLlufvyQmWh1cH9Dm/lTsmf5btaTX2Dk4cOOa6zARoTKMnegcrZ"
    "V5CZ5GpzCjfQGuwsNrpCJHwothgqxLY0TXehdghKs2o6E7EG5Cu9KtQ50J8+qVcAMsAvaNIpo1PkWTGX/kdcCI3GK7IPwIlICeef"
    "3t1dwm/EJ1Lv2W+QH+2AVRa7i+0D+eh9YGmsKlkeyg9vIxm6qPJE3wFJ5BBpD/MC2ken8R47h+ctNAElsCzh7E42+ZxVxS4BZddX"
    "mvWQ9FgmrHAgvzQG2UwVM3o5o0zdbk1/0VoaYWgoNApisVd4a3OIdRSqYf2BluGZpcPKWvNpdKDyEFIZTPJLzQCv9ECaYyyCLsAF"
    "sEHBMfQpUZSnQnnZYu5hqBQ3F2oqndC3krfZ/zgk/gLervdxLoHPkdbuWURnyjFa/C2SQeed6dBGqDRShDWwPdTr6E7oAn6F/oLM"
    "YXuKhjQDZNCaYmkro3MGVsMPYku5o9FhKUX3Gu+8T2RP/CfcC6jO7OUYsRK0DWmIHGeTfAPuSTinMxOoRr90akIN+dviU6m8vgge"
    "zJ+Q0vQ7SDfyINuMeyh7UovZC9pWdA8HRgZZna3z8B34If2OrsoWNy84FaDmzEyLgYpDj0XQ+QF15bLIdZ0O0BRvH3YyhDIFmcvw"
    "WTaPPD82UGsD1EW2Y7vsTdB4JCvdxCzibELfgQXZCjpDNhct6Y1Txsrg8MASMCu2nqPDQ6XywCq8fqAI1AAiRUnfR/6CK5OMs592"
    "lCJAW+gi9B0aT6YX06Ioelqagk7EQSIkzjb+UP+hD8Vq3GrOQEGlJ9QBucY2B1h4BDofvyluh+voQ8FC0F9ogmVC58WLUlmzhimx"
    "Z5wFeG1zOnpdgbg63D8oK5yGjmbei+eD5RzFUwxbDlcPNFGGKJ2AmF7c6BQ4QL2liwNJxg4jyWJODmw2s1SqygyD9uF32KnIarK3"
    "WxPwooO5/4BQOJN+xtsAmWm3B44ia7CX2lJrIPqWraZPwQdTS83l5nWoI/qBegA90z5ro5xzejkMZB5QJbj7eg/ydHSlBuoj9JKc"
    "En4Mz1efqSPM9YGTyMDo08Qi57Iz1FpLCsBi6SU0E7kvPZKRVFMd8d8KqjQgFURO00D8EjSdWm91R9thHQPZmG1MK/OQ2QVtw7UE"
    "5pKT7LNmmJTpZyacXKj3dCYy+8274BvoC7SAGW+r8XNgE+6kxkOLA4PJE+BGtxVXxh0mjddbA5e885meXCEkRqwhYD0jjcuGscSM"
    "e2brhZ0hgRXQdjRTGEDHsNvxTZzPaui0dHuTNd2V0AWoNfca2oDX4CbpM+yKgbb2Xzgj+ZxdyLewyjowvxWvSJ6LZrKSyQ7Oc2+p"
    "QFMkEI6ER3GDlZtBN1wZWY5OdboDX6QMymklYnWG7sPFkD0opwxJpZKcpzAryMOtb2AU3kA250bpv5191lLoA8ST8/WeSPdAI36M"
    "k3TfQ2+px+FU3G/UI7s6mQmcGe+s5Qry67SxOBWuzxnhDmiaUlDVUhWd+tAcKH94jD0O6oEi5HBwiVCDjocui2P04m5Tq7/1E/wP"
    "6YyuRxJcK3spGmCzys2RkYGpegezhTPAfQ32hU7hxcUhWiXkcGKx1tnsYg1PfaNnI2Oshc69YAeytVMXmukFfX1pRb4l/me1Qc6b"
    "meAayBmqKt1UWYdv4aLhDXpPsyN0D4E9vc02lupbhQHhJfABuAhfAOoDVYceUwuEjshhCox34ZZwy8T0ygekB1cHGoa05w4qx/Um"
    "bjdoEUnKIauqc0t6o1e2LLSCEyYeCK2hWagvfFTv62x39kCXWBiRmIriRuc+e0nhpafiAi6irzM1qYVxz6zu9OMOwwXoacBB5IBQ"
    "m27iVECHBjgxo9wMG6Te0Ws47R0fNgPLKccDpfS6Vjqks/hDGWfTVh/EQY/TtfQtXgGrQs7Qhzlt0FXIM3iHpUC854ivC1YlEI8n"
    "nJdSKvXGO1x6rWy19uK9yDCdxrWCxmO7yF3WEbiW8118IvWAnivz0IzSMjgfcsNbATtIBcQJJuB8BDsj45D9EOCpRiad9ehjVgiv"
    "MYahZZAF4mL0gvwYKkXnDFfm7otoeDRxGkn4O5nvTRqeT66ldH2qadhDqUpcWqKx1dhhpPq646b8ba3OAEjmIuc7T8BGUHWyhc6G"
    "x4pjHZj5JWORxlJNa6hZ3h7r/Yx/ZIHUeKu8tdMe57wBF/Nj7RPRx9Gf3vH4KYUQf0NjtVLAe3AXvIXpLDSw04KjsYfUXGuUVgFp"
    "gBUXCnG9aH+4tV6MW6AMhhcEXrPPYuuMPJ6Wzi7ngzczNoN8Q3WjeSbNoeRt+nt9VmA8d1+44fwJLtUGOgODQ7lCvDf8Am/A7Bf7"
    "Q2OxX9RGpptzES7O9kV0/ywy7qbQouwELns4kbotXdXSwUnPOOoAmxk5pqQTE2gmsrc4wBLDm5zXetAdSVbWZ4GDOEK+HVynZ0Zz"
    "h3fqSWs10o6uBjWH6iDd9Gn4FChODwh04vpyBTkPX0Vk4L3IC7CWSyNLlVHeh0ghpziSlcysbCSOiF/EdchGsgyQDYl6VlItaAZb"
    "7NyGzqlHwJbsL02k0zMVhOLMH0flOnOl9SeJgq6MAfR+OKunvDM+UIErZQ1AznlnWzwMIJSnBLLa3u3sZA+IG7yv6A3aaIgj5iKb"
    "7F24Fd5M3nUrQunkitZGrlJgDTdGM7Ehaj8kh3gXCWPPpUVq4eBaaEEwZl2idnJvxXZAFgQmbjkJX0z6GF0I10a6IVe8XQNloDZQ"
    "afKoRCivzcLIBuw7Pss7kOxg1ULOqAWs9RCkljPKco+UtVpFBHIoegWWTr+lD4mVQo+Er+r7vK3coeIdaRF+RrkKfnB6Qb0Dw7iy"
    "1mynZ3AgW00MYEvEds4qbhMfQr4FH8ZqQA9sTE2i5dGl2O7AcaWD/lH8rvRwOMQJB+WqenPhkJA5PNrJi57TSlqdrJ3kLOatNt4s"
    "6dDQdLwcV90qDe2Ao3R6+Z+7MHA5eDAWQmeirQKPwUWJEan/9O32U+gh24tbjx8Or9H7CQWlOlYd+ob7Hsng+a6WgtTI4Vh366nQ"
    "xbwEFwKWgRMCd9Q95Hfyr1gWKRfw01nDI83vTi/khXZB/+mwNOEWNi/Sz6OXNUuHLR8xOLFaf6k01rvrrUlVOpIopqTsZqhKDOSQ"
    "sK1WM4OeLvYEaCjRhI9gK5Dz0maNgNshS1NFreLW0lhraxy2UetDlxMQsYkVITNJuLrSQm2ABLlKlh6u5lyWiuuNkXbGb7ydNQOK"
    "+4vRddgU1xIZGmvlLFIG6s9dR7wN/vYW0usIhdFr4pBoK32MWQyIohXRKdgMzvBMYsaiS/R+VnmxCH2fLmFdxl8GG+nLzIPuaxdK"
    "fdMK6qbVx8qAtrE/Q0UQyXNKSqeuNZ5JNJaf6K9PdM6Dc+CB2AT+q0y6g6Nn9fQuhCxUW4N3odrWbvyGNFFvaTXBOuJH7DVae7s+"
    "eQnfZBxAChBDuMb8YCEhr9a8nqrWbgvw+8m23CfJspJEDuuaW1V8JOFQOrS4EoOm21uwtexQvroelI4o08ij5EtxfjQAVQdmcwNo"
    "SaqkX0K6klnoInp+7Ie0xjnprkT3CyvIhYllqUvOS3c4/yI62TkriexIrqLQA8nkWcWOgCoQ96nDcimjLZqZXpAIooJUEnoH9WVp"
    "sZi615rhZEDyemimq9hPd6zcUCOknVDBeh1sjeUlH+oDmWOxgFsOGC5mDPcMSFBGj0OT4Q6iGR2sPnTfuZ8ohD2ntBduavfET0rz"
    "wC12GldCfwSPhHcg59W6+tpAU/6adEH1pvYgZQNn7NZI38BfKj89MPwDb28WgLOibdkxuDeyIPpLL2G0g+ZxA/RClp5sJ9LS/DCa"
    "6qH/DBaVauud9bp2Yf6feAa8CpXAUH4nspqvLRRLBaGqwbZ6YSujWy3QEjrlvYc/TmRHziNx6XO0mbJYOQb1IQeHXyg99aWG7X72"
    "PhIuQ82DRjz0f+R+qgxRivXyRYRyegOrqdNJrC3ud0H/RnRRdK0+NpDk1vFXpUYWj7Z1Augc9IJSRc9kTOO98YdqQeuyfQreaNYB"
    "gvAs+CPcSugmcOGVqR5mdiAP0Uf4LK2zGfcKvN57FX+G/0dC4RtwfrKM4LdsTx3Skc5IX6l/7AWpH5lFWiaVsZuk3pov3E3eX256"
    "KJ3dRC+KTHfSuVvgQeEProp0EKqLOu+JPNZ6W1WxHVR6pAqSm54vlqW0cDpPJvSkkh5+CAv0HXuRF2I83D/8s/oVDBq1nQgCoSRa"
    "JfhLKayPMUoi84MrTL/cSxhl7/HOpCbzy5AYdh6fCZ0gGwgjxT/I0sAdSuNyM8/ErfyLcHMdQSimHfNRH4UGwxnIMdxcuyDwVbuo"
    "O8gatDbZROhmNoGyYwujDSE83ILS+IJOHmS0ecR0mVpWQ2s48lEdwNUQugioXFHPhWRBl/N5kbNuBZhDR7PHpeX6afCFdEi9x0eI"
    "MgwVOQE/EW1+mDIPy0A/EYwII0PKJTcvPAQpJ36QFrCQNCiaQwESjtGZgOgz7hrvZ3dcoHsw7puJf1GX212g2oFVWjNrJwMQ6/Wr"
    "5AR8dYBgygtt9K3OZmwst4L7ydfiDkdfucP1MeRy7reyCiZJHzSAOh69gESZ6+KZ6C6tldVMTUSC+lrsLHc0lt5Wye7OUW9Hq57+"
    "gS+qE1A1YTpNGV/weYFb7l64D/ZXOQwu448I0/VbxivyCGUzGURA+RXcDQeRvd6T8Azku1tXyCeVUP4pU7TvSMgzhSwseOC62B49"
    "N9lF30s9gY+Ke3DKfeO2JGhawRpxhLQG7hboT/qVT2pjoD5SNdBJb2XU5d5xKWQ7RyoZ3PpCVjcTkid8Vd0C7KNORduTm9j+4l3x"
    "o3QRnAEzSjI+HK6GncU9SBsmId6iroFTsdNkmpjRXg9P4svqWTz7sKex9OpIPeB5Jd7XGurnxGyevPRvGIhgxj1vOuIQJTPtrZZ2"
    "Q6E+0NPCPfUJzOphNUZ/66fNCfZzvKN+3XubqmL9I9tx55UxaH/nPf6fOd965q4IZJUm6GWMl2xQuaa6Rk87hmzGF5P1rBD0Skqn"
    "PFD/qe30wfgYfnmqaSC33B2JowF/FciveywRwdAz2kF1ffAJlZ9qTmcL5yX6Cje9kH8I+Yp6ou4KPHFXensTO8hJXKbIZru51Sb4"
    "nL5q5/JsFLeZ1/WRUEfyLLkfuaIaqbew6imET9MPqPPEQ0pmkZJaoaP4AU4N9DnfS1+NZ1VKGk0hD1pT2K/8UFfCi5GdZoqZKbry"
    "EfeH9xZ+Qr2nHfdWpBcGa6FLvb+8w4z20GH1hDcP1pGeTawVdnMHxbBEevoFEOK4vc7RPOO4JsDF6Af7OAj4DtpNuQGhnoJfXGUu"
    "YtLUWsB6TCYbsYMSOZHX6g5sLS4RJYWfig9pEhxAhphZwnG1vf4JSW80FuBwB1hAhhOLw49j9bA2xHJyDue61ZAbCB/+J7VH5iYJ"
    "uw1ZSqniuOo4sx82Gb/KJ5EZ3h3erthNpBdxlc4ugdHSRhMkrMx0brstoG7iN3e297RLoC2Di6gzfJqQ39NVWCQO0WsiPuaulJM5"
    "wr+TPsqAelTF/CWlTnYN4qA0X7gioWp3+xG0ltnFjNMyEgjzW1xrr3IuK02oK3g2ZZn+CEHQImK6iKjcszti85h4OIbuxPrq5+2+"
    "2ClqjXghGkET5IdoXHmLB7j96k31R3BYbJi1B+tLdqZf8H/VYmZXqzb01/0mPVaf22+kx+6C2As7JPW1FmLDzbpMPfGkdMP2IgWD"
    "i4JjiHFMA3GuFwx9dDOAD9HfUkud9lTERnPtxRNuIawF1sNXECtKT9DW27zYUPqmFk2988xnPeGh0X9eXr1tz8B3cIWEt3acHCjU"
    "caJIJySr2hTdhvWjntl7GZZz+evqJ62UWTRQTAAgF2sjrAu8Uac5D1yTeK9akdPqK+QM+TdyInaFzSV9t3sF7pDzucKprnoN8pc6"
    "QmttlAZaKEnfHeWh8FjZnPxmv5Y+2aWDC/SFrB4fKH5nPP7CdMaIpU7TVum/3arCXS9p21gTtTH8mv6q3FQ8CdJYbx7jmgpg+J9z"
    "j6xIZCOb8ffU5dpbsqR+3F1GLAq/VVV/M/O2M8M8Gp6N3cDb0uWsTtTTsCMXSZ1iPrCj+WrWHbc8WZYO8u/dNvR6DQxIShdkPJ8j"
    "zISnajMEGzmlVnIUWMOPgpMCQ4Kd6Ev2a+Q1PpjJqGyCnxrT7NFwl0Am5qd5zVuQPs0tU3/ZElpdGIkUCwb4UalNgVtIc2UVfyx8"
    "V+EV0TMilkV9SfZlrvGZ7Kd2E2lxdAKcCB12K5H7KUoZgF2xX4jvlWPqRO8BqZhFqh2MGcQ0axBrcTlFKXze/SFmoUoxWBhNmnoN"
    "/YI3H/FEKaEOC/zie2I2dT06yjod/MBIyAawEkAiGwOwv5HwKtqFKiwNQOsGbqlf3J4UQl/iF8f6+hoEKgQPcrXEQeJ0qzW+XVvn"
    "nSP8sI/xU8z06JfoVbcWPULZb7QN/nRBJDfK2DWxsfBCbnGCgvsG7/NXXIjIQjzgm6VwTKQiSlOAR76q9THL/0dpJuymKLUfTdJe"
    "6hGFU52IenRRIbtaxGoWfEZmhOeQMFcv9E5doc82xyKFaB9/W9lmn+VTypjUdu9Y0kUT0U1UnUCfYF6mMVQuWIoy+Z5Md6FqSFe/"
    "Sm2MtkR7IsD0sn7aa9GpAchTlE9HtuSuKZs0UHrHt1IWxeqSa6gMcn3nh3sysTj5VKOJr+5RGEMe2ZpcFGpF/ZHgeG+9JTlUT2c4"
    "6ifSZ+dBawY4e7B3c5CjEnTQvqg20LvjA4IlqY5C/dBHPhfahB5l5BeL8ZpynQsjsFhEXSH+lJYiDTGbbpwybQ9YNLhbiEeOSavI"
    "j9wI/iTYKLgsOYLcoXUCTcSHFg98E9eT95UlsUVWdvgEszD8Sh0g3lbP2cchmrpjPHVfkGN5Tv0lstJqbz9iMz8WvOZJStuJjXwX"
    "8Sz0lisK72OOCr2D2aLHE8fcIFlCWB5u5iTCtnHZXcylIhdJT7IgtM3pBM3DG9E1pM/BFoKVsuzHtmYtxXMR2+SJyVPuSPm+Whj4"
    "5r3MzhWXeQ/xe4S1xPvII9P1HBYLSGcSj/n3novBsfIr79tgCyJf2DSCiTRyh3PMfgp+JkWmK/LH+5WbKjfTrXgW8ZJ0337rtgCO"
    "IXj0Mjknud+uZy4mWhMVAgT/WLrgNpIGo++Z36qLdMUTVBspjJagWRtHNwfeKfWtHMgo/IqxJYkjCNSVuGXfh6KiJR6wH7ALRQVh"
    "PCD+i3ssrAEx/qR6Vr1mf7ZbIJSdgtrjJ+mcSkJN+qfwK1I33QJIZrigz1TLwSWJhtRd1fTUE7pS78hT3CHkDd4/cCJ8TrpqXONg"
    "ablcWCa5Flw4+sRsmqpEVTCLBI+Q26iFTGPig7qf6yFExIO+HoRDjmEY6pWHNz/hW+zfNkXM4LtZAXUTURMvS3CJ0ci14DnuFX9J"
    "yMttRorz52Ouvyc90qFRgSwoOHqM+aY8SxyRWqpYSjVl5A9XhhwhXVWWJKcgKZJjMnC5E1+4DNEEsYKvS3/mbHstHw5Xol/DHYPj"
    "2AHCJzG9lFdy7TeJg0JZ4wZUhTii9gAidDo+Fh6UPOq+8HLSayM/UhlbRZSgeuOf3NZopugJu25wTrBy0JeaIrc1dttxpFYwI9NH"
    "ziZ1xioFmxOTqfkQbRQFugXPkQaPcGO8swNTuTfkIXtncLJdBP2L09Hn2n23UHCnmBtfLE5MqYHcGBAoG7zlfapkJSYwf9QLdmmn"
    "EuwzxkDH8P5CL/mlnYm+bgSoDsHeUgCZjjVnF4QnpDS0L/WMyqGPwC8qx31rkHH4M/5jpAe+T2wuXbdHSqVxKbok0Zg+nRgPDY9u"
    "9o4lFgqrAu3pszYSaRn4GHxBFZKWRdO8+0ksOl5e6F3PQPIxap9MmdP5L/YweQf/ynhtX+CyQxoMU+/tZdwE733upfoLL0MMCZNE"
    "ikiSzamZScvgOU3fxT0HD5LF6TqyT/1q78T5xF9vBr6K4Cf66HsDTWETvch/tH+TT9X3RszTKlgvkEpMD1SMc5GDfAhvjJ22OwnP"
    "hSFOdndxcDA7mc0XReQpgRnJm/YBbpI8MCmHu8krtLXJ6sRlDudPi+VIWXwnvkoMsAvD6ejr0jXjjm8aXF26YVx08+CDhNfiMXKO"
    "E4CXqjvMe1AKHp0c5h3Ht1eLiR2knJ7p2uBgfyY7F4t0gjMQvYW7dgZjotE12ET8SJbFykgX7Xf2Yemzcdh+qMwhsnDLFc7luCPI"
    "UOWG+oAUtSrY5MCm4COuY6izZCtxM52/Q+CmI+LH+enGd0816Y1SJq6nDhj1g7uTT+ym9HV4BZGGdZXnYwG7PH5Dgc3LUT8kUJDv"
    "lzQpWd03jPmLVDSPAqWEwbHcRDn1TlAXe9ObxJBa3LeG5/j90qjk8uRReyYxPtkIO+Te5EdwHY3dZiPA679G1hezk83VJ8ZqqBe1"
    "J5BOCquTtBXe47hD3OUecAuTrZiRqSDxVnnCm6l0UBvqReSWMi45WEbUOFSV08wdxGp2Kt8EbqncR9LCw5M+sxkxN3CduSQW0yeT"
    "owMpdSarJW8ajl8g0PjQxJBkhGvOtxJLolt4XHmudsKHkgx/QkwgHz0TsJf8SwEXi8mrjXPuIvRNDKU/cFODPbBjwi6RUD8av5my"
    "cVb9wwwRoUh96q+Nu5fVR+QfmEI+CY89VPQwuUC+b2QyoVBacpX4249yklgteMvz1FNJWCq0EQljt9g5/gVWCDc6Nonq3/3fwVWp"
    "U1oy8sqnMMuEoVh/In00YCzwTmf/8tmJ29FZznuyddBV9gZrkROEs0KuBGa2YXV5VKASc5zLY9K8EPln14O+891CqPjQSNGKSZqG"
    "WRV5SG4JjhRw+7Lx2vcAuUW2SDUPvTBWYveU/OjlxAmqlJgnQqFV0CZ4yDeaTGN80WJweXiweEDpKj20j5O/udu8mbiivLF7YdvZ"
    "5uFmsIpbJg63N+LEEnlYqHSobKiMyEROKI+518JSZy5h0MeMbcQhMouZ19yNXeXKytfdKnRzlKVKCxeoj7F77oxADqZGsGD4MvMS"
    "zIhmZerje+J/7DPizkCDEMXliX6P8njJ4O7o4OS85BlPMeKFWRCtgtekXsTU0LZQbaJTkOTveU5H4upEqCB8WPtqXAi2UE96SuET"
    "iHHC6VDm6M7kD7IBtYh9Fn4Sy8hvNTmjCepEFxEQmZ5bGZie3JN8bKxIPoDv8N+Ny3wXqTWVNM97JmMVqeHhE4kXXDdie+ACXw7y"
    "SJ/9C4mQkok/LDyUsiVWY6OiGRLr+ZzEe+6a8DQyDCciv6Cy4sZkgehf4y45I2RHlkTLoidJxnxKNqOmJItSbanyxlR0iHe4d01g"
    "HxFITSYwzufZ6H3KNyLK0QeZIvALZC5VPr4rrtM3uYg0MjnNbAt3Ca6UZyX3Elmgf5E84l3jgPvdu9j7iNXJ6aHucgFtLlcqtDV5"
    "GWkd4rF2kuDu5P/4s1IGl0mrhO/nf/Czta1QOXy73Ew8EzljrIvljFb1bhZH8hfF79KYpENVFlToOWlHVybHpV4a9YgR0QJmZypK"
    "VaMcbQkJRQ9GesrD2QOhTvLqVGe4X7CHhBuHjFPk4chweV3yE0OE60jH4H7SHvm9lIkaF52WZI1MUNPgZ6UlvkvuFi9G1cDe8Jnt"
    "N2IZpSTZjjohjNSmEnP540bl0AWjL74l8JO5DXfy1cK3Eif4QqH80RnyU19lHEVGkSVSdbDCFCa+F4rIz8MZ1RzqVXFJ+EoUhtsF"
    "H/E7BVqfGFuTqh3sRr3m1hPdMJbYwI8WS8T7B7+KafJ/ya2hqsRqFCfmJwf4Mhtv0KiShmRESobuMpr2UagqrxMXJNNCe5PPBDP5"
    "3XyMjvfe92G2EJ0a9yWK44XQQf4fcGUiTh0zb2u/+erBudovT2m0N9aOnMff4BsC+4M/iDWkHM0RXZ/cl8xv0vhwNZFoh1elPhh+"
    "/z8/TAqm376M/uWOKtuCS5SG7PbkVk/N+Cn7hKetmsUdGOoQbyJPTmLx+aFlygwNNXXCJtKIAiIf7UiVo9hoQsmt/DG2EM+ZovET"
    "xm3PRTZ39LDhmBMD50mLWk3Uja+IIXC94ENPJ8zLpOcH6yFTwDfhu7An5BfltWcSUZE7zKOEX20Unyz/QS8LR3kQOucJ6Vug1kJp"
    "+ZXdgVoeqxS3yJh2yrM8kCHyMDokXlo9b9SOd/AOSfw2WsDvmExiQ3pmoJX3HPuaH46NF6cKM4Wd0VzKnEDecK34IzWQOCM0jg8T"
    "Mpix6C9kjjgH2xuvYFQjsvA1qKxmOrM4vJJPhQ/7C1FXxOneNvIg4hDHmdkTP4xqviohK7rTKQOPIv4Z6al68Q3J685JYYycI7hC"
    "EqMps4TvEHubmQc/5dbHTiXK+M4G14a6yI19bxCGux2Z5y3BLwlNF4eFc/JsZAGWkSuHjI49N9L7ljDP/JS2VUt4BhKTtUHYKb6W"
    "LHuahRYl/7grcZ9fIy/7HzM6AgXWJI/4y+JNw2u9G4MvIznMXiFP9IW6/f8bXoT751sXbhGPMOtSZxMZzVbEoPgtpoc8OrUh9EFc"
    "lSwBZ8PK4AWphLYXK0cMTeaDJwTh0Fsmh1SHOMd/il7h0yUuqX9wmVjKHDRqy+Pj733n+Vmh45EHylkDMSFzTexKoqHvkXGF6+Wt"
    "Tn+KrE+NDxoUhB/3d41b2iP3ClmeGhUKmpODPNE93jteXJXMvPhXoqhvCTaePs/Nl3Uuig9hBsSLULWEjvIXY1PSo5RU5UR6s3Ow"
    "pfTNIMwTkXuR2tJi5h93gN/pfYkf8rTFAE3zz5TzKgf9Xu58tK88UW6rTNSOaiftb3wy6pqV4erewnhNYjUTiC6hjjGjZD2BaNfB"
    "Ed4GwWB0XbCZ7Ddf+rrg6f2vtLdGlkRT4gkTM0sqzfHlUnZzF78m3DJ+w3NDfBXZInenPvHPFJ0qDS8nGNWCniAl42Xh2cmFyA9k"
    "XOhYxDZHYffJZ5GF8be+1vGB8Xbxec4bfzH8XfiscpLLLa1OzpbPwRsFJfpK+UbNFjx4bionNz40GR4Xe+jLZd51mlLR6CEiiG9I"
    "3fUcZ4rEf/rvRBvCC5Dt/HVzOzIOPcQQiV2mL2nxgjYx+IKJSsXjGdTnYjW8HrU41AidFNzPVKCGRW9Fq8grQ1kT46k+VM3Q2FBp"
    "H27WoW7xjyOiWdN+EM1B5dJYdG78OZfRuIfe8eczD5Cd4n/IHcniqSDdVjjsaRUvit2ldhHfuWHJo0ZO8yNDy5lUW3uG9I2vjjsQ"
    "Sr0M14jXj8+Pv4/3R+rEM+Cz+PJBEL7tzaKUCxPRNfL7WHPYS1/1FEcnxNsGGoLjvH1Dh8RtycLEa7JCvFRwHeGNngrnU01/KeJI"
    "7Hki6J8YOhuBE2Hc5fZpWYxLPsC84jkevuzLGolEV6G5uZahsyHaHREfrSBUR2mKUFlqFp/Iv4m2lO8Z2SP/orR6AtkudA29i3SS"
    "cuGt8JNiAeadME7eZOY2p3krQ7vjBTy7+f+IonJtX1u5onclWUKOUYVg3D+Rex5pKhP+ZeRFYbOsQ2NiGlSAahLfqIqJdFpFY4v5"
    "hH0dTpjlpJHe7sRXsmFoh73eP5bKl7jkP8r2lyvHzxk34XLx9ImLfpfabrSD28AlfSNjLSlU+BLJEu1m1A2fj+z3kIk6vhO+vJGa"
    "4WFqt0QRPD1+QTjCwJEzzEclDWwAnxbWxkrCNYPPjK/eoWy1+LXI1CRPXeSKhw74TxtZfc+YtdGxKq699FTHH3J+vpXvDTdBfIu2"
    "DqwPnQyPlu/6WmLBSBVY13g7AR0PZdV2yjND9/ynPaUDk4QkVUYuK+z2P6HXKB5f+9DbSAO5nW+dP0COiRZAt3rHhFjPCqVpvFf8"
    "OrIIq+m7GVmaLEpsCA+QhsUde7d8B29MrVQ2EGdji5A0ak+0O9caDhBf+Eah4coNsrU8gaTNPMqLxN7QvOBatT/2jOtN9RJrhHzx"
    "HvGg2itYMFQdiZiFfEe46XLPeL1EfyoBL5ZzuUP9rxnLHRtj3RP+hWQheZSyk7gQuRRJ+WrKc+U8amvle+RU7AsJiZNQNFHD+8Ao"
    "GVgVmxLv5pMSxz1GtC41Ov7GaA9nxl8yvT2T4wc9Zah9Tm7fq5AYYRPNINrXIP46UU3ukOhkfPf99B3mNseycv88bcmg9pBfJawQ"
    "bobaU/eY+tL9SEcfrX0ytvkrSO+Q8lh6YkGoYGKyeSCShzkd/ss8YLLyUbUbLnGtYJPJzv8Ua4WyRvc4EFVe8UILQ2DCay5NoPB1"
    "Xlabp/JZtfHbgc+hn5HM2pzQq9gC6jRfWX6f+GV88zSXc+DHBcJXgtgfucj0k/vHrxId+d++lfGf2g9P7UQdPJe417wYWh7vqjXC"
    "J8ZvkzeYR2Kx+MdE58RRDoa2CgMirVRXoqgn3LzQBXFR/B8/JfgmVELUzbtwT2IlMsH/jZse7RdvlAC1zHw9323fcCZDuEwwfXyF"
    "Y+HtMTrRVzqWaEStUgpjBGJALjFJvIG2864NbhBNE0u4WpX463gff3fJj4cSi0IO3xImklXjf8lTRpHwiOTS8I/ojfhKo0fQ5t4K"
    "6ajCvqPMruRY5RdhaJm4TomWdGdZRvNwM7GHEVOrrs2RF8rvjOHkKrA0Qfq3aAv8C+J24pKWl6rg80cOx0EqnTA49NPIjjOGnzvC"
    "fhbvcSv1cvJrtCG+BZ0d/BypCEfksak9/NJoPbmNr5Wc201FN6VuRZbFy2AXiVXxBnhen40+9bfBnsc2x2WtEbzKe9+fXaxFZdFW"
    "sPHEaSaDfUcsLk8nIkKr0FN2NCjAX3E/NSI011yOteCHJ8b4M5sU7oq/yO/CxcRHtL8Pc6FEDd8/RsdPRr6RDeOltA+J3JFsVFny"
    "coTzvfLn4hrLZdWK+CviK5MMbY+fT6hUU9xNZEzcjUz2Pva3D7Ji/fBquQsouqfRR75a2BT1W6i0sik+05yQbIj+Jy/3XoruCrG+"
    "t/59oT6ShSxhiyXWpor47gfby9/RUvAZZFDoUeir/yQfcjeF5slHDNrOpk2KV6YmhwzmJzlezYJf9VN8tVC68M9EfV/ncEU5f6JM"
    "uFFktPdAtIU0RukLn/Kd8f2OlPedir/zHfKtZB74vhC1qf/s8wKLE+QA+SY+PNYuMSU6VM2T4LU7aIFEA98b7TayXLwbfcuPDsVw"
    "J/ne/zw0Srjkuee88VWJjBZwul0ob7S8vDHWmb0XL4pfZcqonz0P/fm1WWLYpBIVxLfRqvhi/wGicfAUUVGdR9SQF8eX+BHPRXxZ"
    "7ARKCKuFd7E26pFQwXhuT36lmtYlnp58EvntueodT/SgBspZjducXzgQX6mOkVbJK2TZ3BMMUZtIk3qH+yKtsBHheeYZ6FzEY7YN"
    "kdETXErYEVqudsDP4OWJ6vKU1Bm2Yqgm2iLYMHIhNFTOm/gihKlvzNAQJufjrvkqSiHtrL95XI/ejrdIRM2VsabeGXGPVtZXMSjw"
    "aOQUMhR5E7iudYPbxN/5j4vnfJe4qalXaFUpj36N+k49Dvm0W6EWcuH4iXgt3/to7/CHYKbEW88INamh0FZ/uUTfRMj+4xtE/ec8"
    "YqrHs/o3xjNqf6UciS+JPeI4BRLW+senRhCbBSfVxNfUt0fLYXRSbuP1I5BmIO3keXEkcUge7T9INEzsiI/BhhD7giuYLsTbhD81"
    "MjpCzCLUiPxOVDWuRqolvMRd/lAoZ+IXejhUDT4ZshKVfevledrOeFvf34Dhv4p28PXypeMIzSOA5txgcekc8hkhY3m1IqEhoZGh"
    "jNG7wbfEYQaOYkSlRJ/QUnkdlcl9Er+WiEfXxbfFL4QHJKb5f6KRhJro7lsRf+TvFGodfhkLxn/4ihB4/GViOukTy3qLB8vwWuIO"
    "0yG0Xrniq8W0l7J5DzD15eJEhdC0aBulY9yrTVUvGovAlnyP0E6tt1wikhtp4dN8GD1F3CJW0XjjqGeU+pL7yY0RZa6/f66/om8i"
    "kcKzRPolLhDTmMsxEk+G74UQRYoVTaTXnoUUrbnWxditQdBy/DFZWX1DxMSySp0Q7JsZPWl4cU9oRnSi0DxRJlQ+8sRXA28Suoj0"
    "8Nw2ZodGxYcyLX0RPBYkBQ9EELuZWnBlukJK8eUT/kRHEj0jI+MlpDrhfniW2LrQdf81Zgj4hikLvWKmiYI6RL7g/4XZOCPEhNeh"
    "IomvkXtSdnsWtyXE4VO9S9T+oU3yPOEd2izxMlo+kdu4wHyI9Il3TYSF7yHBp3DLQjnVfYHRqKFUUirgWLAPMTuew26MfxbOh2cG"
    "b/uPxItqH0KrPEXDUyJZ8RXgauVOpFxI1ZYEV4ZZKAkVIqaF2saTYslEN+kkU857y38xUEmOwxuieOpS4Da6L/rXt4el46ciX5g8"
    "/H9wZuqM/y8xXdgK3+AORR7EZbw6pUW9CZRsy/eJTBU3yIUSCF4SP+23hBvRVNCI2fGHRItQ91B+Lp/olW/4GyQ6R0YyX31mPLOv"
    "ITFSgeU23nFEjUQ74nOgndYRXsYciTSUuycuxEuEliC14flEr/AAqLHWH66ZiPkkPBLZ6c8tVlBHYD/imGAI7eOHfT1Dn30lgrOI"
    "aXIg3kXrIN8k9oQwbx98aHxcsHw4r3o6Vp6vHpKD50PDxE+ejaEWeC6KwbdHe+EtU198xambzDJ2Z6hMhDWv/q8guACM2moAAEy5"
    "vsvLvSR3vTbJ5SWXl+S9cOUoTg1oi7sVl+LuDsW3sTFkuBRn27/hbqX4xgYMhltxGMPGNoY7/N+nJlnpdjO4OzI7Zisa7eSEt4br"
    "O98GxmuzjOF2bV9dvq5VGp5QU71P0BD5tnrIe87f305QnsBhcLz+u2+OXc+ZruW6NWLKKAusOeik0TjcC+c6H0EArvLeVT9DJtcU"
    "3FDjzYHyHMa7fNH23BtUECxQctTH1trQKbLDXy+wJHGDfdZ6bU3wNUbj1AT3Z7XA6MUhOtJZr9fCU4NRdCQeJhwTBsjzpFfKGPeK"
    "ccVaaP0nrDVqFv1HaSI/l1VlNRooIXe1muuLNf4mx9ATkgl3sIKYdGOJtVgm5hNzkLNdLZewnaUW/ZzbZTfQJ4DhnK386N1hRJyf"
    "QCWlB/4s9q06wp0Pmnt2gY/8B3ADvbd6eS+rX2mPtJq4hb3MuqD+g2+pvwhRMlmo706UfodP1SRfs4iJmfq71dvp7b5UkdMy8hcq"
    "K71AprJKa2gO4D7jriYM1WrqrlraksBB9CghObFKeLF1XA3jY967UkfuGJwYK1mQO8e/lBEZAnPc/+SVam1ue9G3wtLAOdUNDHTP"
    "OLFqOSJbWtITkALnqWlKdf24OBsN0C5Y76U5xBG3kJfeY76zMN7/RrgVXIQivsNSIt6GvlFqwv+8DWVXOaE14zpwT61LKgPxrI99"
    "HHVzxmnNYRucHulJ5qJP3jv4itONvyq1c5f6/XqKMhDvtNLIQ35p0YsQFntoNdA+SKXZNaWXko/7hS4o6w0qSoFL1kzjtNfr6sog"
    "3JyopCdebYSkTGUmOQhtYwooG36mGrCjZvnqhMPwTUI9/Dceyi0HY90ysC47oDxUpsYuQ/e8Xyq5IBq65Q3C0+y8usPq52SYJZnH"
    "PQ3zfGpcOXsWmao3IbtI0OkDL0vZfI6POBvNy/xt8YhURImXDaWdJ8U7gNVhdWHd8FmiOU0jIz1iYIgvCR+yBjintPJwvbbZnhJp"
    "o+OkYno7p6/vlDVHrcfeSlTBZFLMMG4NauyOdP8Qi8eJoqUY7sqY9p4EY5x7ImG60tXpAQXSxunl5suV3JJwKvgVbJc0d5o2lnuD"
    "68iFgit6lI/eVU4R33R0y1JCuvsMvo3NCZ30jpXGc62DE/FT6ZXlCF95VyCvXouvZ50Em5WpZLq10TrBBHEeCpB37AzwORm+vVIZ"
    "67uYNF89eTL4Fpl6Q3gfBtAqtFz9UZqqaYQ6RT2O74UwxnPBO0Er7aZ5b0qbjJOW5e40RnDPvc0CY7X9qJP4wuqiDsdDHZEliJRk"
    "2i2d5Eiisp7MMZo4b5xXmCO1uLSk9+p43xBmkMZOduSxVDxY1erjNJWbu8PweesBVCMjis5HjdQj4JWXpwPgCfI93snvBr31VM9J"
    "QTFLCZOcVUV78LekHKctV9f2kgh9723KTeD2co21kuSZ1yFPpCJGo7gG4FzkMOym/kv6cd+I/8MzrJv8v8IpoZXngvB9oCme4Dmn"
    "1SPNtefkmLQE3/FyZp61MZTveaK1xZ94i7RxB7t3hHOkqdPKbas2xFNwQbgUV1aRSB1uKYCBkr4xzj/xA8wT3pLWILYeZYfWi03d"
    "H8DxeInrK48MFcOqoUUb2UfQLnWI21yuzz2OHxF32nqn0vAi7x889bXR+nCDbAwP42Jkh3KU+K37Vle3ESpFvrA+j70J63FfiZni"
    "NemIt1JAA4+LAP8Fct0Kuk3claKgzAq3w9cTp3jjY81QKZzh3rF+EjX8h9WA1XI6aSWUo26+7wDqHK4rl1O+tt4orbSy1hb7vTLb"
    "3kYSfX9a2e4pto0/yUZERrk63wXX1Yd5VkAfXRKeZb4EK0CS51/LJGIw1W0lNNNHOY+UoXgmmKGbTrb0ztpufIZnaiWwz+cPDvUs"
    "wN3cPJajf2OdcjjxAp0uXgElnD8lLXSeTTMK+c3WA6uZ/EZ9iqrhf8ANvj8bRW4Zozx95EdC0FDIH0Fd3IHO+Md5IBFJKZCtrgyd"
    "kioowyLz1XPWbRaPUtxYEhUnWpnkoDSRv8OueDllAf9BWaNKQjNnvvGQPWMDUP24ZfhC8G80Dr8gM8AnKV3uSppq/TAQz8SPJdNw"
    "HNePvCLVnK3sqW9jeLRbFqpyN7wF3QbnhbfWDdYfZ8tCYldthLaDTHaWyj217ngPuCOlKzNCxc3rCfvQBakaaU/aSF2cT6ynOyY0"
    "2zznfSDdFdbbk4NBFPWP9nwb+zT2pFbOmYKuS3FmFXyPVQVZcogs9/UgMvdJ2WD9Le2wP7BvuVboNVsPorAiQdax+Gd8KmnrDov7"
    "IeYsziKrneHuYH8xZWHMzuB69YgaZO19HaWyTPClxjXBY8AmcFyYBD2+OwaK+RG8kn627vOztJ7gJGxupwTG4oru+lA/dy/Gbkax"
    "7vqmcCXxsectf4xc9e4M9QwNtt+zQW4w9jdBS/hL3QhEmofGg3+0lWCF4YWG9I81y/7ViAnVdm5LUXqGfI8mh/+SBtrpZBeahJfj"
    "NPe68nl4GOovH+WrgXRs2oe9dmgxzuLqYg/XQP7G/mR1cveIGcHb3iHEcMaBLqikwZPG8jvhc7gBlCambxy8jTuRg96JqCY3FP4i"
    "XRF+YYW+afpetRfZHNqHt1gdnPveJ96P6gDyk3ct6uXUdDtzR0Ih+xXszSRfa7e7L+IfDauQQlAOdYfTcYVoH92XkOf2JRVIdW6g"
    "FmU1/WdZkMxSL7H52gbc2DzK3gT/VeuQbuRl0UbkDzVPzCYF5A07J/0l/CdVVhRnrlKZ+EifUEvb6zsQvSMmkB+tdzgH5sL7YCEq"
    "Br4GWbCB+9pdY7Sz9yhhMo/UdZKlfWCY9tHpiGsRQErrW6EXTAfj3cRQd9LRLYPSAnnqWrGEbyHcGS6l1EL3BSSWIfeCTbROnIc0"
    "Z7NxV/9hYRHgfR3IEHsMrI5HoQtM4Dq7SeRrrEQLvY1xM9QE/Ca9U+6ybzRDPM76sAaorzsCfw/+pJPQ5NjvIVT2FM0ItCZvvKuD"
    "Vcl/2gGrN1mndgZDIiUSVkRrqHXwFK2B081fTS1LksQ6YI12hB1i8cEzsEhgGBnvBKzfaB83D1xz3rK/+Bm2ozTSU8hCkuwbom7R"
    "65JbrFCK6u2jhaqOR9pL3F/5ZDve5f1V3F/E20IbssZ7yfsfO0zPgmrcc+splBKopzgoYTV0K8SWA+0IFHtwfrcPEWFN0oCc9e71"
    "r8K7Yo5K7dEm86RU3S1KFoJVYDv8IPdVP1pK5K7RW/6VrRHn+w+zmupngYvWa6IHNogNyUBSgSviuSGdUieQ+6y49LV3hladGNF8"
    "ksTi2ELGuJWSzRX6SwdExcAHwM9sSszv0jU2A1UOjSB10HlwGc+18wJ10R/sOqvii0gLwLMEr/EWfOAvizeEMNeILcJdwMf4jqQ0"
    "OqzuI2v1a+oh2pTVdhe7J4OzwSg7l/uL+gPlo1/icWSK/Uh8qD6MH2G30MpzRQgC/XxL+EmBZsQrfIG/RKd8WCypHhLilbRIbbIU"
    "aXJz5zC6wC+MbQyesmJcjJKDW0T2l2DE9K7GU50RvE99oTY1masn/RA45zRyv8J/eftg27MoNFfr7k5wX3oKQuNJLXcAOEnHkC7k"
    "hnc/iLc+Jtbyb8GdyT/MK9bSqviXwlUQGdXcIcAPS4o/wQXSEvFvVtVN9B+BftyWrArvFTn/ZfbQm5m0U0wB9UC90BX2ANTlkKpY"
    "D+EMvFFfia/AONGHfWJ7tzdqTHI8/wNHvae8yTjRc1U5Rj8DMvydFidHhLnkkH7PaoD3wbm4cpIP5rMN6hP/n2JLjOBzVlrYBr5W"
    "wvJqJU1/Si9J9dFF47yUwNliuWAcySXLotncIf4A3I6eUxB+Z3ytzjaaor64BilUkmgMgb4jhkeUxP1wSrxMmpIz9DJ8wD9mr9gH"
    "oZ+ehk8pm+yuqA7/PDg1dAF1lQaRqXCYiaOT8Qy4LyLgS0IFsS8aSg6yH5R88IZHwVH6ULU3rs8OCovZavCLN4OkiOWtjyWusnYg"
    "M+iSmebYSOu4OtpmfRY4IbXmPgmXnXlwPRyuZcotQQfPMb48KkVvsvfxp4JQldRH8cesZ9pPQplAH6MF2QR3a7doJe46N5wcpYQI"
    "7r98B3czeO4kW3PBFkVQZ8Ec8nmMyNUFiQnLwOdgi5iqrMfF1MvCAnhUXBnI9NWJK0fP0/+omLAvsT2u534NX/OpOAc0Md8FW6KD"
    "/FVrUTA1fNgq8L6D94StOJFbBtN5Kgwma2BZXyGLw7K4QPlT0MRkFqSjubuizr01WOC4cpwW4WLCmZElKBL+h1aUk4keSU4qSReD"
    "q04psXKkKLdc+Q7U9bfGT5TVsbvEi8ItIQvjQFiZrZWAtUCWsoyrhl6yUuoaewKq4/bk4kVTLE5DXA3/FmEEGo+NJCx38e+Cjbk4"
    "ZZo9Dr1yEsVp4mfwV0nGNxyOfmQz8ZfgCSsRLIx/QBcmHmOqlW2PxstIX2d/eBD3xAqKLfki4kn+f+GGLNf7iP+Az9Kp+L5xjrXh"
    "jnuvUwwWQR3+wm9QRgq/sSXGxJjB+Khwlr8fX0wco80nSdxHI4crw+7RUZFDnsqyxKri+9IkMZX7QLuDLfA2rY4eMQH+y7JhDe4d"
    "ysOFsCx9ZjXiIkI8d4KWF5vZu/AzIQ5dwMuNjTAbv46/wk9FftYEneGT4VPhkHiT/ojXghFsLgOB7toSMhSclrzqJ7rNiCrrxG9w"
    "KeblpsFkuRlQwwq3F5bk3tOX9AX7WXyshiJ36UXe4NZpQ9lo8kRIVndqV2kKN8zuDXr4R2rL4QFSluuECoDLHbH+pd3jCuBEcI52"
    "QLP06v4V2lHrtPAnjBNixZLBnuh/cDnfAtcnf7Ga2hG6iHVEGVxLrXzwNb3H78Cc+th5wO7wp2ia9atYJFyAliWWUFuBVDmWi1O/"
    "hJfpM3TdCSdNgRXUr1FP/xlvd/RQTFAp9yd75YOebNDWLoteCSNAf7MbEtWf6UBWRlS8/bQr9CfKBx/z38H9odYgrWjI2uRwQl/2"
    "hD4EW0AN/Ji+F6aBSpF74gPhCrnhW0R6aUnqdrBZu6x051YHYpUS4t/8r17ABcS+WlbCOvt3Nkw+wy6Ke1AJ0APttAe4nWE40pqF"
    "5JXoDp2JFuKLsa3RYLAYJUd7+5/yF0kJrlDcYFQBHFxqqNzf9Ge+mBAqmuQPCj3AVb4j+2Cp4kE6GerhupoRaYueS6fRy9htylL2"
    "BeoLNuhluK1maTXC/Q89c76F9bR8d1wolHBATlKuCv21a3SbNgfmkQKhD7ovPqQH8EuhMtfJXxvdBS3Nt3QP2cP1J3e9mrXOKQYT"
    "9YV2S6Jx6/SK6p98Z1SayxLncDPhDWUHeENz0UXWzsA2H1iDh9rxZLD8TFoCq/kfWSnGDniXv8XHiP1YQ9RC/hxb3NfiMm2dYZrE"
    "bsG+gcU861BywlfwBnFjz/O3+bJiOfERvahcIrmRdLUJG4su0k16Ofyz9xo/0Nxuf4ejnqB1xZ+r3acp5kZtv/sN2AADynXhNE2x"
    "BhuvjP5AoR/ULF8wOAofFuPoe3KKXwcXCHfATtgGdfc/EH3Cb/x42hXvZlvMj/QPusAeGy3EP8IfYL42FrTVlIRB2shIjpTARqv5"
    "cLqxVfuV9qSTpD7gXPCENRK9o081qFfS2/IZ4hF+mVETNTX+snaxS/xIritXA5wO/kKnBbAal9CWFQ+3CpUOXtBmwzWBVnY7brv2"
    "E1stFhIgvI8tDgXzEs1GicTPNQc3nVZyf1SXJggH1dr+dK4FFxH9aiXSlQ4EL0CUe8HvhrIs0Gx9MGphBNSXlsw6gjFCVf+/2hTn"
    "J36HpgRb+zuBZzRNvK62QPX0IeYC7Qnfi14lQ4zm+KWYKGR4i4olSHn/S+OFtz2N4SpGywmhaAOjHOdTxnH90EgyBO3ylxEwNxB9"
    "AbaCANvgpEfXBeaGzEBtrQ2tKHYF7VBFqzqYIubxH91XdLtZWtyAhqI8rpCuhiHvCKN1ZEqgHlrAHkrNUXFhsjiONqC3QJ48CYyJ"
    "1DfGMByZIA3Am+Eo8J6fqUfgIPBCC3LQX8H6FlwyxhqDkJ9WsnqBjkZtMNcYwkXUPO06nyQYsqDvwWXUlZYlfiSbcC/03khnCljC"
    "BtKBxhKts78heOksIKlSDrJJa7u2MYxVpT8bN4WpYjhajj3w+sVktNZZ78zRluI2kWraCDlZbEoVpT2YQLsaZehFpx99zh+0mpuT"
    "lQfokm8kG0Nfof14LjzBLyZrldbUsMaxV7Ep9Csww0mJDAdlhRF0MDeY/S4sL9GbdgCtWH862sixaxhrIcdtUpbaWdF7Ui7tolXl"
    "hpor4Q36ih/DHTRqgsWwD/0yMMicq7vCN46mhvSqKMDxwkv+OF9aGU43G89IpaS+xl4yXe/CVTMO8x6hGz2rZUZ/E+2wT/+IpsNs"
    "NpZ2YN/HKGom5xeKi5/UUUYSlNXhbBRtxk4IlaLDwO98F6OZGVVf0IkwILQFlVQrdMjI9Y80LqGQ0tlY42yDt1FN+oewBFQ3GtN8"
    "rh5tRJdqMx0m8ECVyln5wnzYkl0HhMsAxbm7qI3xDz/GQFxNw8cp7LHQkS6yq9DR9JhRi1YWT/N7oC5/AfsbC8S35DrRLT3ahbal"
    "vPotHi43oQPoEXGwVgO1Mj6QnYIizg4FaCdjN6lPJ6PFdnnWkpJISGxmvFRG4kXa6EiqOpRGhR60IUXCa+kq3AvGGf1AXSM1qdBa"
    "JT7XblgQntdeixW5ArsFqEaNhJ04h45nPn9rvT7YZg6iiepQY542wvPWl6KORtlaWbMbiBdU/2hWmiZYleA2u4PR2tNbKymMZf2M"
    "OXgOkGkZ3xyzEx2OZusFLFe+SdrR4moqbAPyhEHSIKOEUFbtaYy2q3CvnW14jM3D9lo7Md2qYmzEFWg48FlMD+Om0pm29OQZrchm"
    "XM8o0OaBtsZ/fAjqdp55T+1lbHPCejN6RuDNbLrC/k5qaSwny9zyAhSG0P12Mq1Dl9ivhZF0mvMDNpNSGBHi6VyztZlt7NNmKkG1"
    "L91jDzBmOTlGBdbNCJsk6W9ht12dZlipTBRGyruxLOy1L2rD6CIxy14ozsLfxuTZzWlLubxaVatqpCY0NNqxDlRV29ttzESYy64o"
    "6cEMqKuCUIPuMHONVL8W3OL8Fh+vTrCbafmhsJWsVFQmGBpcK6kJvY39chv7ptEqso9lyC3MA4kV7VNomz7SbG2Mt0eYtelmZ775"
    "zrlGHG6jM8woEFW8kyzWEuh2/Cn2gK2zWEFWKqtZ5jxzlFxBUFBa9D+1ctRUy6ktqKGmCO/IPKeKhK2hcnmaI+9na3Eae4i6051s"
    "urPAKRIi0c5amvqrkBJMFtpHwkIbtlUfFzGFfdJgmqFWZJMD6bCWsVebEGlF5+sLtTQ43NgVSkBbjZfkkjbbGW62MtNQEyMj2lrO"
    "U/JC7VkBXq5dit3DFpjLZBllRVawVOs3tQpShQyhkmCFx9k5kTpGvtlebgSuoHSaa+YrO5zGRq4911EEjbWN5MHuRqaVKmRZr7Q5"
    "Tr6RLmYJmB1CD4V8e77TztzLXmopSEUkoUOkrTzWlpM+Oe0iOWwd1iIFpk7byLkeA40yNdrcKHTGmSg2FWloj1ZZGG+k0nQhE1e2"
    "xsi5eke9ErpMdprbnT1mBjaEjKSdzgG2Q9eEMabJltlLQ6+1T6SdfEXrYM7TMyKjTZVlsRzToCG232hkjJZDtIO8xwgh01pB2uuF"
    "Wkhoay40O9phtAb8LFRimOY7o9hlLQNlJa3AaQJGRDbl3WZ7Y3wkjdtPstQJ7IC2S9uup9Gr2hx9uf1OW+h8cN5rW5109FYrcD5o"
    "KtVRRaEiWkreaBPksDpW3uVk0or0rRKm+5Vd5huyz8yiN7QlzlhzsbnYmWBmqpXRfFyJYmEZy9cXmQYzoxnUjFRmHewM1lG+rhF1"
    "nLxf2+OE2Xg5pC4xiaUL17RFTqaw3Nyp73P22R+VynS5s9RcoH/UCFrqdIzsdfY77c3lbK+Z5+x2VpgdzSw03vykrdBNekA30QGT"
    "0EyWp+/Xb2qZaJlToC/XDzjLzF36Ip2whfp+c7G+V1+mr3CW6Lv1pfo+fY/+f4/cSQc="
)

_BUILTIN: dict[str, tuple[tuple[int, int], str, str]] = {
    "smollm2-135m": ((30, 192), "".join(_SMOLLM2_135M_CODES), "".join(_SMOLLM2_135M_ORDER)),
}
_PROFILES: dict[str, Profile] = {}
_BY_DIGEST: dict[bytes, Profile] = {}
_LOCK = threading.Lock()


def _load_builtins() -> None:
    with _LOCK:
        if _PROFILES:
            return
    for name, ((layers, channels), codes_b64, order_b64) in _BUILTIN.items():
        codes = np.frombuffer(zlib.decompress(base64.b64decode(codes_b64)), "<i2").reshape(layers, 2, channels)
        order = np.frombuffer(zlib.decompress(base64.b64decode(order_b64)), "<u2")
        _put(Profile.create(name, codes, order))


def _put(profile: Profile) -> None:
    with _LOCK:
        _PROFILES[profile.name] = profile
        _BY_DIGEST[profile.digest] = profile


def register_profile(profile: Profile) -> None:
    """Make ``profile`` usable by codecs (``profile=<name>``, or ``"auto"`` for its shape) and by readers."""
    if profile.name in ("", "auto", "none"):
        raise InputError(f"profile name {profile.name!r} is reserved")
    _load_builtins()
    _put(profile)


def get_profile(name: str) -> Profile:
    """The registered profile ``name``; ConfigError for an unknown one."""
    _load_builtins()
    with _LOCK:
        profile = _PROFILES.get(name)
        names = ", ".join(_PROFILES)
    if profile is None:
        raise ConfigError("codec.profile", name, f"'auto', 'none' or a registered profile ({names})")
    return profile


def profile_by_digest(digest: bytes) -> Profile | None:
    """The registered profile with that content digest, or None."""
    _load_builtins()
    with _LOCK:
        return _BY_DIGEST.get(bytes(digest))


def find_profile(layers: int, channels: int) -> Profile | None:
    """The most recently registered profile for KV of ``layers`` x ``channels`` (``kv_heads * head_dim``)."""
    _load_builtins()
    with _LOCK:
        found = [p for p in _PROFILES.values() if p.codes.shape == (layers, 2, channels)]
    return found[-1] if found else None
