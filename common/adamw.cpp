// adamw.cpp: (to be written)
