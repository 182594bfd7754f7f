"""Build the tool-calling recipes' parquet files from math rows; see verl_laminar/data/tool_math.py.

    python recipes/tool_calling/prepare_data.py --input ~/data/dapo_math/dapo-math-17k.parquet \
        --input ~/data/dapo_math/aime-2024.parquet --out ~/data/tool_math
"""

from verl_laminar.data.tool_math import main

if __name__ == "__main__":
    main()
