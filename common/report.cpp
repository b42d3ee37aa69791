// report.cpp: (to be written)
