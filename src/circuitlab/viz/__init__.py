"""Static figures (matplotlib, Agg backend) for analysis results; import from the submodules."""
import matplotlib

matplotlib.use("Agg")
