-- Configuration key of the memory check `tetra run` makes before building the model
-- (lua/tetra/config/fit.lua).
return {
  train = {
    device_memory_gib = { type = "num", default = 0, min = 0,
                          doc = "memory per rank the layout's estimate must fit before " ..
                                "anything is built, in GiB; 0: the device's own (a GPU's " ..
                                "total, or this host's available memory shared by its ranks)" },
  },
}
