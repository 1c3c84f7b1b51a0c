/* moe-test-h5.h - HDF5 helpers shared by the profile tests. */
#ifndef MOE_TEST_H5_H
#define MOE_TEST_H5_H

#include <hdf5.h>
#include <stdint.h>

/* moe_test_write_foreign_h5: a valid HDF5 file that is not a profile (one
 * int32 dataset "data", no attributes). Returns 1 on success. */
static inline int moe_test_write_foreign_h5(const char *path) {
    hid_t h = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (h < 0) return 0;
    hsize_t d = 3;
    int32_t x[3] = {1, 2, 3};
    hid_t sp = H5Screate_simple(1, &d, NULL);
    hid_t ds = H5Dcreate2(h, "data", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = sp >= 0 && ds >= 0 && H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0;
    if (ds >= 0) H5Dclose(ds);
    if (sp >= 0) H5Sclose(sp);
    return H5Fclose(h) >= 0 && ok;
}

#endif
