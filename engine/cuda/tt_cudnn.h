/*
** tt_cudnn.h — finding and opening cuDNN 9 at run time (engine/cuda/cudnn_load.c).
**
** Tetra never links cuDNN: a machine without it builds and runs, and attention falls back
** to the built-in kernel. The graph library (libcudnn_graph.so.9, which holds the backend
** API and loads the engine libraries beside it) is looked for in this order:
**
**   1. TETRA_CUDNN=0 in the environment: cuDNN is not used at all (1 or unset: used;
**      any other value is refused, and cuDNN is not used).
**   2. TETRA_CUDNN_PATH: a directory holding libcudnn_graph.so.9, or the path of a cuDNN
**      library file (libcudnn_graph.so.9 itself, or any file in the lib directory such as
**      libcudnn.so.9: its directory is used). When set, nothing else is searched.
**   3. Python wheels (nvidia-cudnn-cu12 / -cu13, as PyTorch installs them): the directory
**      nvidia/cudnn/lib under each site-packages directory of TETRA_PYTHON_SITE (a colon
**      separated list), $VIRTUAL_ENV, $CONDA_PREFIX, /opt/<any>, /opt/<any>/venv,
**      /opt/<any>/.venv, ~/.local, /usr/local and /usr (lib/python3.N/site-packages and
**      dist-packages).
**   4. The system loader path (dlopen("libcudnn_graph.so.9"): LD_LIBRARY_PATH, ld.so.cache).
**   5. /usr/local/cuda/lib64.
**
** A library found but older than 9.0, or one without the backend API, is refused (with
** its path in the reason). Opening needs no GPU, so all of this is tested on the CPU.
*/
#ifndef TT_CUDNN_H
#define TT_CUDNN_H
#include <stddef.h>

/* One search with the current environment, no caching: 1 and the library's path in
** `path` when a usable cuDNN >= 9 was opened, 0 and the reason in `why` when not. */
int tt_cudnn_probe(char *path, size_t path_n, char *why, size_t why_n);

/* The process's cuDNN, searched once: 1 when usable, 0 when not. The first time it is
** not usable, one line goes to stderr saying why and that attention uses the fallback
** kernel. */
int tt_cudnn_available(void);
/* Path and version (e.g. 91900) of the library tt_cudnn_available opened ("" and 0 when
** none). */
const char *tt_cudnn_path(void);
size_t tt_cudnn_version(void);
/* A cuDNN entry point by name (NULL when cuDNN is not available or lacks it). */
void *tt_cudnn_symbol(const char *name);
/* Prints "tetra: cuDNN attention is not used (<why>); falling back to ..." once per
** process (also for a graph cuDNN refuses to build after loading). */
void tt_cudnn_fallback_note(const char *why);

#endif
